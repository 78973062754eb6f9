"""Cost models: the CostModel protocol with constant and linear forms for tests, the roofline over
hardware and model profiles, its aggregate (batched) forms, and calibration to measured timings.
"""

"""The KV cache: its configuration (one definition of the `kv` block), block pools for the paged
and slab allocators, the prefix cache and capacity from hardware.
"""

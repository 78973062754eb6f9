"""Trace loaders: the three formats, built-ins, round trips and every malformed-file case."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.traces import (
    TraceArrays,
    TraceError,
    load_trace,
    load_trace_arrays,
    resolve_trace,
    write_native,
)
from sim.types import Request


def _write(tmp_path: Path, text: str | bytes, name: str = "t.csv") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def test_azure_format(tmp_path):
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                         "2023-11-16 18:15:46.6805900,374,44\n"
                         "2023-11-16 18:15:50.9951690,396,109\n"
                         "2023-11-16 18:15:50.9951690,10,1")
    reqs = load_trace(p)
    assert [r.id for r in reqs] == [0, 1, 2]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert reqs[2].arrival_s == reqs[1].arrival_s
    assert (reqs[1].num_prompt_tokens, reqs[1].num_output_tokens) == (396, 109)


def test_vidur_format(tmp_path):
    p = _write(tmp_path,
               "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,100,10\n1.5,200,20\n")
    reqs = load_trace(p)
    assert [(r.arrival_s, r.num_prompt_tokens, r.num_output_tokens) for r in reqs] == [
        (0.5, 100, 10), (1.5, 200, 20)]


def test_native_format_with_optional_columns(tmp_path):
    p = _write(tmp_path, "arrival_s,num_prompt_tokens,num_output_tokens,priority,tenant,prefix_id\n"
                         "0,10,5,,a,\n1,20,6,2,,p1\n\n")
    reqs = load_trace(p)
    assert reqs[0] == Request(0, 0.0, 10, 5, 0, "a", None)
    assert reqs[1] == Request(1, 1.0, 20, 6, 2, None, "p1")


def test_length_only_file_needs_flag(tmp_path):
    p = _write(tmp_path, "num_prefill_tokens,num_decode_tokens,num_total_tokens\n5,6,11\n")
    with pytest.raises(TraceError):
        load_trace(p)
    tr = load_trace_arrays(p, lengths_only=True)
    assert tr.num_prompt_tokens.tolist() == [5] and tr.arrival_s.tolist() == [0.0]


def test_builtin_azure_conv():
    tr = load_trace_arrays("azure-conv")
    assert len(tr) == 19366
    assert tr.num_prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert tr.num_output_tokens.mean() == pytest.approx(211.1, abs=0.05)
    assert tr.arrival_s[-1] == pytest.approx(3501.7, abs=0.05)
    assert np.all(np.diff(tr.arrival_s) >= 0)


def test_builtins_resolve_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(load_trace_arrays("azure-code")) == 8819
    assert resolve_trace("sample").is_file()


def test_relative_path_uses_base_dir(tmp_path):
    _write(tmp_path, "arrival_s,num_prompt_tokens,num_output_tokens\n0,1,1\n", "x.csv")
    assert len(load_trace("x.csv", base_dir=tmp_path)) == 1


def test_write_native_round_trip(tmp_path):
    reqs = [Request(0, 0.0, 5, 1), Request(1, 0.1 + 0.2, 7, 3, priority=1, tenant="t"),
            Request(2, 1 / 3, 9, 2, prefix_id="x")]
    write_native(tmp_path / "o.csv", reqs)
    assert load_trace(tmp_path / "o.csv") == reqs
    assert TraceArrays.from_requests(reqs).to_requests() == reqs


def test_unsorted_can_be_sorted_stably(tmp_path):
    p = _write(tmp_path, "arrival_s,num_prompt_tokens,num_output_tokens\n2,1,1\n1,2,1\n1,3,1\n")
    reqs = load_trace(p, sort=True)
    assert [r.num_prompt_tokens for r in reqs] == [2, 3, 1]
    assert [r.id for r in reqs] == [0, 1, 2]


NATIVE = "arrival_s,num_prompt_tokens,num_output_tokens\n"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

MALFORMED = {
    "wrong_columns": ("time,in,out\n0,1,1\n", "header"),
    "missing_column": ("arrival_s,num_prompt_tokens\n0,1\n", "header"),
    "unknown_native_column": ("arrival_s,num_prompt_tokens,num_output_tokens,prio\n0,1,1,1\n",
                              "header"),
    "non_numeric": (NATIVE + "0,1,1\n1,abc,1\n", "row 2: column num_prompt_tokens"),
    "nan": (NATIVE + "0,1,1\n1,1,1\nnan,1,1\n", "row 3: column arrival_s"),
    "inf": (NATIVE + "0,1,1\n1,inf,1\n", "row 2: column num_prompt_tokens"),
    "negative": (NATIVE + "0,1,1\n1,5,-3\n", "row 2: column num_output_tokens"),
    "negative_time": (NATIVE + "-1,1,1\n", "row 1: column arrival_s"),
    "zero_prompt": (NATIVE + "0,0,1\n", "row 1: column num_prompt_tokens"),
    "zero_output": (NATIVE + "0,1,1\n0,1,0\n", "row 2: column num_output_tokens"),
    "fractional": (NATIVE + "0,1.5,1\n", "row 1: column num_prompt_tokens"),
    "empty_file": ("", "empty file"),
    "blank_header": ("\n\n", "empty file"),
    "header_only": (NATIVE, "no data rows"),
    "unsorted": (NATIVE + "0,1,1\n5,1,1\n4,1,1\n", "row 3: column arrival_s"),
    "latin1_bytes": ((NATIVE + "0,1,1\n1,2,1\n2,3,1 caf\xe9\n").encode("latin-1"), "row 3"),
    "binary_garbage": (bytes(range(256)) * 4, "header"),
    "huge_value": (NATIVE + "0,1e30,1\n", "row 1: column num_prompt_tokens: out of range"),
    "huge_time": (NATIVE + "1e30,1,1\n", "row 1: column arrival_s"),
    "missing_value": (NATIVE + "0,1,1\n1,,1\n", "row 2: column num_prompt_tokens: missing"),
    "short_row": (NATIVE + "0,1,1\n1,1\n", "row 2: column num_output_tokens: missing"),
    "extra_field": (NATIVE + "0,1,1\n1,1,1,9\n", "row 2"),
    "blank_line_inside": (NATIVE + "0,1,1\n\n1,1,1\n", "row 2"),
    "azure_bad_timestamp": (AZURE + "2023-11-16 18:15:46.6805900,1,1\nyesterday,1,1\n",
                            "row 2: column TIMESTAMP"),
    "azure_unsorted": (AZURE + "2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:45.0,1,1\n",
                       "row 2: column TIMESTAMP"),
    "vidur_non_numeric": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,x\n",
                          "row 1: column num_decode_tokens"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_trace_one_line_error(tmp_path, case):
    text, expected = MALFORMED[case]
    p = _write(tmp_path, text, f"{case}.csv")
    with pytest.raises(TraceError) as info:
        load_trace(p)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(p) in msg
    assert expected in msg
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, TraceError)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="azure-conv"):
        load_trace("azure-nope")

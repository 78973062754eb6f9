"""Trace loaders: the three formats, built-ins, round trips and every malformed-file case."""
from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.core.types import Request
from sim.workload import traces
from sim.workload.traces import (
    TraceArrays,
    TraceError,
    load_trace,
    load_trace_arrays,
    resolve_trace,
    write_native,
)


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


# --- Chunked reading: a file is parsed CHUNK_ROWS rows at a time ------------------------------

TRACE_FIELDS = ("arrival_s", "num_prompt_tokens", "num_output_tokens", "priority", "tenant",
                "prefix_id", "num_prefix_tokens")


@contextmanager
def _chunk_rows(rows: int) -> Iterator[None]:
    """Set ``CHUNK_ROWS`` for a block (hypothesis tests cannot take ``monkeypatch``)."""
    saved = traces.CHUNK_ROWS
    traces.CHUNK_ROWS = rows
    try:
        yield
    finally:
        traces.CHUNK_ROWS = saved


def _outcome(path: Path, rows: int, **kwargs: bool) -> tuple[str, object]:
    """Everything a load returns, exactly (dtypes, value types), or its error message."""
    with _chunk_rows(rows):
        try:
            tr = load_trace_arrays(path, **kwargs)
        except TraceError as exc:
            return "error", str(exc)
    return "ok", {f: None if getattr(tr, f) is None else
                  (str(getattr(tr, f).dtype), [(type(v), v) for v in getattr(tr, f).tolist()])
                  for f in TRACE_FIELDS}


WHOLE = 1 << 40  # a chunk size no test file reaches: the file is read in one piece


@pytest.mark.parametrize("name,rows", [("sample", 1), ("sample", 5), ("azure-code", 1000),
                                       ("azure-conv", 4099), ("azure-conv", 19365)])
def test_chunked_builtin_traces_match_whole_file(name, rows):
    path = resolve_trace(name)
    assert _outcome(path, rows) == _outcome(path, WHOLE)


def test_chunks_are_bounded(tmp_path):
    p = _write(tmp_path, NATIVE + "".join(f"{i},1,1\n" for i in range(10)))
    sizes = [len(c) for c in traces._read_chunks(p, list(NATIVE.strip().split(",")), 3)]
    assert sizes == [3, 3, 3, 1]


def test_chunked_azure_times_count_from_the_first_row(tmp_path):
    stamps = [f"2023-11-16 18:15:{s:02d}.{ns:07d}" for s, ns in
              [(46, 6805900), (47, 1), (47, 1), (50, 9951690), (51, 0), (59, 9999999)]]
    p = _write(tmp_path, AZURE + "".join(f"{s},5,6\n" for s in stamps))
    assert _outcome(p, 2) == _outcome(p, WHOLE)
    with _chunk_rows(2):
        tr = load_trace_arrays(p)
    assert tr.arrival_s[0] == 0.0 and tr.arrival_s[1] == pytest.approx(0.3194101, abs=1e-12)
    assert tr.arrival_s[-1] == pytest.approx(13.3194099, abs=1e-12)


def _rows(n: int, bad: dict[int, str] | None = None) -> str:
    """A native body of ``n`` rows, 1-based row ``r`` replaced by ``bad[r]``."""
    bad = bad or {}
    return NATIVE + "".join(bad.get(r, f"{r},{r},1") + "\n" for r in range(1, n + 1))


LATER_CHUNK = {  # errors past the first chunk of 3 rows: body, expected message tail
    "bad_number": (_rows(10, {8: "8,abc,1"}),
                   "row 8: column num_prompt_tokens: not a finite number: 'abc'"),
    "zero_tokens": (_rows(10, {7: "7,7,0"}),
                    "row 7: column num_output_tokens: must be >= 1, got 0"),
    "back_in_time_at_boundary": (_rows(8, {4: "1.5,4,1"}), "row 4: column arrival_s: arrival "
                                 "earlier than the previous row's"),
    "blank_line_at_boundary": (_rows(8, {3: ""}), "row 3: column arrival_s: missing value"),
    "blank_lines_spanning_chunks": (_rows(2) + "\n" * 7 + "9,9,1\n",
                                    "row 3: column arrival_s: missing value"),
    "too_wide": (_rows(9, {7: "7,7,1,7"}), "row 7: 4 fields, but the header has 3"),
    "not_utf8": (_rows(9).encode() + b"10,10,1 caf\xe9\n", "row 10: not valid UTF-8 text"),
    "too_wide_then_not_utf8": (_rows(9, {2: "2,2,1,2"}).encode() + b"10,\xff,1\n",
                               "row 10: not valid UTF-8 text"),
    "earlier_column_wins": (_rows(10, {2: "2,2,0", 9: "-9,9,1"}),
                            "row 9: column arrival_s: must be in [0, 1e+09] seconds, got -9"),
    "earlier_check_wins": (_rows(10, {2: "2,0,1", 9: "9,x,1"}),
                           "row 9: column num_prompt_tokens: not a finite number: 'x'"),
    "earliest_row_of_a_check": (_rows(10, {5: "5,0,1", 9: "9,0,1"}),
                                "row 5: column num_prompt_tokens: must be >= 1, got 0"),
    "prefix_longer_than_prompt": (
        "arrival_s,num_prompt_tokens,num_output_tokens,num_prefix_tokens\n"
        + "".join(f"{r},4,1,{9 if r == 8 else ''}\n" for r in range(1, 10)),
        "row 8: column num_prefix_tokens: longer than the row's prompt"),
    "prefix_cell_typed_as_the_whole_column": (
        "arrival_s,num_prompt_tokens,num_output_tokens,num_prefix_tokens\n0,4,1,\n"
        + "".join(f"{r},4,1,{-1 if r == 8 else 1}\n" for r in range(2, 10)),
        "row 8: column num_prefix_tokens: must be a whole number in [0, 10,000,000], got "),
    "true_false_words_in_one_chunk": (_rows(3) + "4,True,1\n5,True,1\n6,False,1\n",
                                      "row 4: column num_prompt_tokens: not a finite number: "
                                      "'True'"),
    "inf_beside_text": (_rows(6, {4: "4,Infinity,1"}) + "7,x,1\n",
                        "row 4: column num_prompt_tokens: not a finite number: 'Infinity'"),
    # pandas reads blank cells as "" in a text column holding an integer past int64, so a
    # whole-file read keeps the trailing blank row and fails it first.
    "integer_past_int64_beside_text": (_rows(9, {2: "2,99999999999999999999,1", 3: "3,x,1"})
                                       + "\n", "row 10: column arrival_s: missing value"),
}


@pytest.mark.parametrize("case", sorted(LATER_CHUNK))
def test_error_in_a_later_chunk_names_the_file_row(tmp_path, case):
    text, expected = LATER_CHUNK[case]
    p = _write(tmp_path, text, f"{case}.csv")
    kind, message = _outcome(p, 3)
    assert kind == "error" and message.startswith(f"{p}: {expected}")
    assert (kind, message) == _outcome(p, WHOLE)


MIXED_TYPES = "arrival_s,num_prompt_tokens,num_output_tokens,priority,num_prefix_tokens\n"


@pytest.mark.parametrize("text,reads", [
    # int64, float64 and blank chunks of a column: one chunked read.
    (MIXED_TYPES + "0,5,1,,\n1,5,1,2,3\n1.5,5,1,,\n2,5,1,1,0\n2.25,5,1,3,\n", [2]),
    # true/false words in one chunk of a numeric column: re-read whole to type it as text.
    (MIXED_TYPES + "0,5,1,,\n1,5,1,2,3\n1.5,True,1,,\n2,False,1,1,0\n", [2, None]),
])
def test_whole_file_reread_only_when_chunk_types_differ(tmp_path, monkeypatch, text, reads):
    p = _write(tmp_path, text)
    seen: list[int | None] = []
    scan = traces._scan

    def spy(*args):
        seen.append(args[-1])
        return scan(*args)

    monkeypatch.setattr(traces, "_scan", spy)
    monkeypatch.setattr(traces, "CHUNK_ROWS", 2)
    with suppress(TraceError):  # the second file is broken; only how it was read matters here
        load_trace_arrays(p)
    assert seen == reads


ODD_CELLS = ["", " ", "0", "-1", "1.5", "abc", "nan", "inf", "-inf", "1e999", "True", "False",
             "1e30", "99999999999999999999", "18446744073709551615"]


def _cell(draw: st.DrawFn, column: str, t: float, prompt: int) -> str:
    """A valid cell of ``column`` for a row arriving at ``t`` with a ``prompt``-token prompt."""
    if column in ("arrival_s", "arrived_at"):
        return f"{t:g}"  # whole and fractional times: chunks type as int64 or float64
    if column == "TIMESTAMP":  # 7 fractional digits, as in the Azure files
        return (f"2023-11-16 18:{15 + int(t) // 60:02d}:{int(t) % 60:02d}."
                f"{round(t % 1 * 1e7) + 12345:07d}")
    if column in ("num_prompt_tokens", "num_prefill_tokens", "ContextTokens"):
        return str(prompt)
    choices = {"priority": ["", "0", "3", "-2"], "tenant": ["a", "1", "NA", "", " "],
               "prefix_id": ["p", "2", ""], "num_prefix_tokens": ["", "0", str(prompt)]}
    if column in choices:
        return draw(st.sampled_from(choices[column]))
    return str(draw(st.integers(1, 60)))


@st.composite
def _trace_files(draw: st.DrawFn, broken: bool) -> tuple[bytes, str]:
    """A CSV trace in any format and its format; ``broken`` salts it with odd cells and rows."""
    fmt = draw(st.sampled_from(["native", "native", "azure", "vidur", "lengths"]))
    if fmt == "native":
        optional = draw(st.lists(st.sampled_from(traces.NATIVE_OPTIONAL), unique=True))
        cols = draw(st.permutations([*traces.NATIVE_COLUMNS, *optional]))
    else:
        cols = {"azure": list(traces.AZURE_COLUMNS), "vidur": list(traces.VIDUR_COLUMNS),
                "lengths": ["num_prefill_tokens", "num_decode_tokens"]}[fmt]
    odd = draw(st.sampled_from([0.0, 0.02, 0.05, 0.2])) if broken else 0.0
    lines, t = [], 0.0
    for _ in range(draw(st.integers(1, 24))):
        t = max(0.0, t + draw(st.sampled_from([0.0, 0.25, 1.0, -0.5 if broken else 0.0])))
        prompt = draw(st.integers(1, 60))
        row = [_cell(draw, c, t, prompt) for c in cols]
        if broken:
            row = [draw(st.sampled_from(ODD_CELLS)) if draw(st.floats(0, 1)) < odd else v
                   for v in row]
            shape = draw(st.sampled_from(["row"] * 40 + ["blank", "short", "wide"]))
            row = {"row": row, "blank": [], "short": row[:-1], "wide": [*row, "9"]}[shape]
        lines.append(",".join(row))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    data = (eol.join([",".join(cols), *lines]) + eol * draw(st.integers(0, 3))).encode()
    if broken and draw(st.sampled_from(range(20))) == 7:  # now and then a non-UTF-8 byte
        at = draw(st.integers(len(",".join(cols)) + 1, len(data)))
        data = data[:at] + b"\xff" + data[at:]
    return data, fmt


def _check_chunked_equals_whole(tmp_path_factory, case: tuple[bytes, str], rows: int,
                                sort: bool) -> None:
    data, fmt = case
    p = tmp_path_factory.getbasetemp() / "chunked.csv"
    p.write_bytes(data)
    kwargs = {"sort": sort, "lengths_only": fmt == "lengths"}
    assert _outcome(p, rows, **kwargs) == _outcome(p, WHOLE, **kwargs)


@given(case=_trace_files(broken=False), rows=st.integers(1, 5), sort=st.booleans())
def test_chunked_read_equals_whole_file_read(tmp_path_factory, case, rows, sort):
    _check_chunked_equals_whole(tmp_path_factory, case, rows, sort)


@given(case=_trace_files(broken=True), rows=st.integers(1, 5), sort=st.booleans())
def test_chunked_read_reports_what_a_whole_file_read_reports(tmp_path_factory, case, rows, sort):
    _check_chunked_equals_whole(tmp_path_factory, case, rows, sort)


@pytest.mark.parametrize("expected", [1, 4, 100])
def test_column_buffer_grows_past_a_short_estimate(expected):
    column = traces._Column()
    chunks = [np.arange(start, start + size) for start, size in [(0, 3), (3, 3), (6, 1), (7, 5)]]
    for chunk in chunks:
        column.add(chunk, lambda: expected)
    assert column.values().tolist() == list(range(12))


# --- gzip-compressed traces load exactly like the CSV they hold -------------------------------

def _gzip_copy(src: Path, dest: Path) -> Path:
    dest.write_bytes(gzip.compress(src.read_bytes(), mtime=0))
    return dest


@pytest.mark.parametrize("name,rows", [("sample", WHOLE), ("sample", 5), ("azure-code", WHOLE),
                                       ("azure-code", 1000), ("azure-conv", 4099)])
def test_gzip_trace_loads_like_the_plain_file(tmp_path, name, rows):
    plain = resolve_trace(name)
    packed = _gzip_copy(plain, tmp_path / f"{plain.name}.gz")
    assert _outcome(packed, rows) == _outcome(plain, rows)
    got, want = load_trace_arrays(packed), load_trace_arrays(plain)
    for f in TRACE_FIELDS:
        a, b = getattr(got, f), getattr(want, f)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), f


def test_gzip_is_detected_by_magic_bytes_not_the_name(tmp_path):
    plain = resolve_trace("sample")
    disguised = _gzip_copy(plain, tmp_path / "sample.csv")
    assert _outcome(disguised, WHOLE) == _outcome(plain, WHOLE)
    # and a plain file named .csv.gz is read as the plain text it is
    named = tmp_path / "plain.csv.gz"
    named.write_bytes(plain.read_bytes())
    assert _outcome(named, WHOLE) == _outcome(plain, WHOLE)


@pytest.mark.parametrize("case,rows", [*((c, WHOLE) for c in sorted(MALFORMED)),
                                       *((c, 3) for c in sorted(LATER_CHUNK))])
def test_gzip_trace_errors_match_the_plain_file(tmp_path, case, rows):
    text = {**MALFORMED, **LATER_CHUNK}[case][0]
    plain = _write(tmp_path, text, f"{case}.csv")
    packed = _gzip_copy(plain, tmp_path / f"{case}.csv.gz")
    kind, message = _outcome(packed, rows)
    assert kind == "error" and "\n" not in message
    assert message == _outcome(plain, rows)[1].replace(str(plain), str(packed))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "bad_crc"])
def test_corrupt_gzip_is_a_one_line_error_naming_the_file(tmp_path, damage):
    body = (NATIVE + "".join(f"{i},{i + 1},1\n" for i in range(5000))).encode()
    packed = gzip.compress(body, mtime=0)
    data = {"truncated": packed[:len(packed) // 2],
            "garbage": packed[:10] + bytes(range(256)) * 4,
            "bad_crc": packed[:-8] + bytes(4) + packed[-4:]}[damage]
    p = _write(tmp_path, data, "broken.csv.gz")
    with pytest.raises(TraceError) as info:
        load_trace_arrays(p)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{p}: cannot decompress: corrupt or truncated gzip")
    assert info.value.__cause__ is None


@pytest.mark.parametrize("stamp", ["-1", "7", "1.5", "2023"])
@pytest.mark.parametrize("rows", [1, WHOLE])
def test_a_number_in_a_timestamp_column_is_not_a_timestamp_whatever_the_chunk(tmp_path, stamp,
                                                                                 rows):
    # pandas alone reads a lone "-1" as the year -1 and a mixed column as NaT, so a chunked read
    # once gave another message than a whole-file read
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 f"2023-11-16 18:15:46.6800000,5,5\n{stamp},5,5\n")
    kind, message = _outcome(p, rows)
    assert kind == "error" and "row 2: column TIMESTAMP: not a timestamp" in message


def test_a_folder_a_device_or_a_misspelt_builtin_is_named_as_such(tmp_path):
    """A folder given as the trace read "no such trace file"; a misspelt built-in name now
    suggests the built-in, and the CLI prints the same line with exit code 2."""
    from sim.cli.main import main

    (tmp_path / "traces").mkdir()
    cases = [(str(tmp_path / "traces"), "a folder, not a trace file (give the CSV or JSONL "
              "file in it)"),
             ("/dev/null", "not a regular file (a FIFO or device); expected a trace file"),
             ("azure-convo", "no such trace file (built-in names: azure-code, azure-conv, "
              "sample); did you mean the built-in 'azure-conv'?")]
    for name, words in cases:
        where = str(tmp_path / name)
        with pytest.raises(TraceError, match=rf"^{re.escape(where)}: {re.escape(words)}$"):
            traces.resolve_trace(name, tmp_path)
        assert main(["trace-stats", name]) == 2

"""Large logs stream in bounded memory; long lines, CRLF and a stray bad byte are handled."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

from distdoctor.explain import explain_files
from distdoctor.explain.reader import LogSource, iter_blocks

REPO = Path(__file__).resolve().parents[2]
NOISE = "2024-05-01 10:00:00,123 INFO [rank{r}] step {i} loss=0.{i} lr=3e-4 throughput=1234.5 samples/s error_rate=0\n"
FAILURE = ("[rank3]: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [10.0.0.4]:4242: "
           "Connection reset by peer\n")


def _write_log(path: Path, lines: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(lines):
            fh.write(NOISE.format(r=i % 8, i=i))
            if i % 5000 == 4999:
                fh.write(FAILURE)


def _peak(path: Path) -> int:
    tracemalloc.start()
    try:
        report = explain_files([str(path)])
        assert report.findings[0].data["occurrences"] == sum(1 for _ in open(path) if "reset by peer" in _)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_input(tmp_path):
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    _write_log(small, 20_000)  # ~2 MB
    _write_log(large, 200_000)  # ~20 MB, ten times more
    peak_small, peak_large = _peak(small), _peak(large)
    # One block (1 MiB of bytes, decoded) plus bounded groups: same order for both sizes.
    assert peak_large < 12 * 2**20, peak_large
    assert peak_large < 1.5 * peak_small + 2**20, (peak_small, peak_large)


def test_line_numbers_survive_block_boundaries(tmp_path):
    path = tmp_path / "log.txt"
    _write_log(path, 30_000)
    report = explain_files([str(path)])
    lines = path.read_text().splitlines()
    for e in report.findings[0].data["evidence"]:
        assert lines[e["line"] - 1] == e["text"]


def test_overlong_line_is_cut_not_loaded(tmp_path):
    path = tmp_path / "long.log"
    path.write_text("x" * (3 * 2**20) + "\n" + FAILURE)
    source = LogSource(name=str(path), path=path)
    sizes = [len(text) for text, _ in iter_blocks(source, block_size=2**20)]
    assert max(sizes) <= 2**20 + 1
    assert explain_files([str(path)]).findings[0].data["signature"] == "gloo_peer_lost"


def test_crlf_and_a_stray_bad_byte_after_the_first_block(tmp_path):
    path = tmp_path / "win.log"
    body = ("ok line\r\n" * 200_000).encode() + b"progress \xe2\x96 cut\r\n" + FAILURE.replace("\n", "\r\n").encode()
    path.write_bytes(body)
    report = explain_files([str(path)])
    assert report.findings[0].data["signature"] == "gloo_peer_lost"
    assert not report.findings[0].data["evidence"][0]["text"].endswith("\r")
    assert report.checks[0].get("reason", "").startswith("some bytes were not UTF-8")


def test_benchmark_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_explain.py"), "--mb", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "lines/s" in proc.stdout and "peak" in proc.stdout


def test_benchmark_smoke_per_rank_logs():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_explain.py"), "--ranks", "16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 per-rank logs" in proc.stdout and "(the killed rank is 13)" in proc.stdout

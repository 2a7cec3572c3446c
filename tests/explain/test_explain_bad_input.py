"""Bad input (issue 39): a 10 GB log, a log cut mid-line or mid-traceback, colours and another language around
the traceback, a job that did not fail — a clear answer, never a traceback of explain's own, bounded time
and memory."""

from __future__ import annotations

import io
import time
import tracemalloc

import pytest

from distdoctor.explain import explain_files, explain_text
from distdoctor.explain import reader

FAILURE = ("[rank1]: Traceback (most recent call last):\n"
           '[rank1]:   File "/w/train.py", line 30, in <module>\n[rank1]:     main()\n'
           '[rank1]:   File "/w/train.py", line 22, in main\n[rank1]:     raise ValueError("bad shard 7")\n'
           "[rank1]: ValueError: bad shard 7\n"
           "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
           "[127.0.0.1]:40100\n")


class Endless(io.RawIOBase):
    """`size` bytes of training chatter from a generator (never on disk), then the failure."""

    LINE = 64       # bytes per chatter line, 16,384 lines per MiB read

    def __init__(self, mib: int) -> None:
        self.chunk = b"".join((b"2026-11-27 10:00:00,000 INFO [rank0] step %08d loss 0.5" % i).ljust(63) + b"\n"
                              for i in range(16_384))
        self.left = mib
        self.tail = FAILURE.encode()

    def readable(self) -> bool:
        return True

    pending = b""

    def read(self, n: int = -1) -> bytes:
        while len(self.pending) < n:
            if self.left > 0:
                self.left -= 1
                self.pending += self.chunk
            elif self.tail:
                self.pending, self.tail = self.pending + self.tail, b""
            else:
                break
        out, self.pending = self.pending[:n], self.pending[n:]
        return out


def test_a_10_gb_log_is_read_in_bounded_time_and_memory_with_true_line_numbers(monkeypatch):
    # The real bounds are 1 GiB of head and 64 MiB of tail; smaller ones here keep the test's CPU small.
    monkeypatch.setattr(reader, "HEAD_BYTES", 8 << 20)
    monkeypatch.setattr(reader, "TAIL_BYTES", 8 << 20)
    monkeypatch.setattr(reader, "MIDDLE_BYTES", 64 << 20)  # the middle's search has its own test below
    mib = 9_537  # 10.0 GB
    stream = Endless(mib)
    tracemalloc.start()
    started = time.monotonic()
    report = explain_files(["-"], stdin=stream)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    top = report.findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,)) and "bad shard 7" in top.title
    check = report.checks[0]
    assert check["skipped_bytes"] > 9 * 10**9 and "counted" in check["reason"]
    assert check["lines"] == mib * 16_384 + FAILURE.count("\n")
    assert top.data["evidence"][0]["line"] > mib * 16_384 if top.data.get("evidence") else True
    assert peak < 64 << 20, peak
    assert elapsed < 300  # reading 10 GB without matching it: seconds here; generous for a loaded machine


class Middle(Endless):
    """Chatter with a watchdog timeout in its middle (between the head and the tail scanned), then more chatter."""

    WATCHDOG = (b"[rank3]:[E1127 10:00:00.000 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective operation "
                b"timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                b"600081 milliseconds before timing out.\n")

    def __init__(self, mib: int, at: int) -> None:
        super().__init__(mib)
        self.tail, self.at = b"", at

    def read(self, n: int = -1) -> bytes:
        if self.left == self.at:
            self.left -= 1
            self.pending += self.WATCHDOG + self.chunk
        return super().read(n)


def test_a_failure_in_the_middle_of_a_huge_log_is_found_with_its_true_line_number(monkeypatch):
    # A 2 GB log scaled down: 8 MiB of head and of tail scanned, the watchdog line 20 MiB in, in the middle.
    monkeypatch.setattr(reader, "HEAD_BYTES", 8 << 20)
    monkeypatch.setattr(reader, "TAIL_BYTES", 8 << 20)
    mib, at = 40, 20
    tracemalloc.start()
    report = explain_files(["-"], stdin=Middle(mib, at))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    top = report.findings[0]
    assert top.data.get("signature") == "nccl_watchdog_timeout" and top.ranks == (3,), (top.id, top.title)
    line = (mib - at) * 16_384 + 1   # the chatter of the blocks before it, then the watchdog line
    assert top.data["evidence"][0]["line"] == line and "SeqNum=77" in top.data["evidence"][0]["text"]
    assert report.checks[0]["skipped_bytes"] > 16 << 20 and report.checks[0]["lines"] == mib * 16_384 + 1
    assert peak < 64 << 20, peak


def test_a_log_cut_mid_line_inside_a_traceback_names_the_rank_that_raised():
    cut = FAILURE.split("[rank1]: ValueError")[0] + "[rank1]:     raise ValueE"
    top = explain_text(cut).findings[0]
    assert top.ranks == (1,) and top.confidence < 0.8, (top.title, top.confidence)


@pytest.mark.parametrize("wrap", [
    lambda t: "".join(f"\x1b[31m{line}\x1b[0m\n" for line in t.splitlines()),                       # colours
    lambda t: "训练开始，加载数据集……\n第 3 轮：损失 0.52\n" + t + "错误：训练中断\n",                        # Chinese
    lambda t: "学習を開始します\n" + t.replace("\n", "\r\n") + "ジョブが失敗しました\r\n",                    # Japanese, CRLF
    lambda t: t.replace("[rank0]", "[rank0]").encode("utf-8").decode("utf-8") + "Ошибка обучения\n",   # Russian
])
def test_colours_crlf_and_another_language_around_the_traceback_change_nothing(wrap):
    top = explain_text(wrap(FAILURE)).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,)), (top.cause, top.title)
    assert "bad shard 7" in top.title and "\x1b" not in top.title + top.detail


def test_latin1_bytes_around_the_traceback_are_read(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes("Démarrage de l'entraînement\n".encode("latin-1") + FAILURE.encode() + b"fin \xe9\n")
    top = explain_files([str(path)]).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,))


def test_a_job_that_did_not_fail_is_said_to_have_not_failed():
    healthy = "".join(f"[rank{r}]: epoch 1 step {s} loss 0.{s}\n" for s in range(50) for r in range(2)) + \
        "[rank0]: training complete\n[rank1]: training complete\n"
    report = explain_text(healthy)
    top = report.findings[0]
    assert top.id == "log.W030" and "nothing failed" in top.detail and report.exit_code() == 0
    assert not top.data.get("candidates")

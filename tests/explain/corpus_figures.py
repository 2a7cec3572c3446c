"""Figures of explain on its development corpus (tests/explain/corpus): python tests/explain/corpus_figures.py"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
CONFIDENT = 0.8


@dataclass
class Outcome:
    file: str
    kind: str
    truth: str
    answer: str
    confidence: float
    ranked: list[str]

    @property
    def top1(self) -> bool:
        return self.answer == self.truth

    @property
    def top3(self) -> bool:
        return self.truth in self.ranked[:3]

    @property
    def confidently_wrong(self) -> bool:
        return not self.top1 and self.confidence >= CONFIDENT


def ranked_causes(report) -> list[str]:
    """The distinct causes in the order explain ranks them: the top finding's candidates, then the rest."""
    top = report.findings[0]
    causes = [c["cause"] for c in top.data.get("candidates", [])] or [top.cause]
    causes += [f.cause for f in report.findings[1:]]
    return list(dict.fromkeys(causes))


def evaluate() -> list[Outcome]:
    from distdoctor.explain import explain_files

    index = tomllib.loads((CORPUS / "index.toml").read_text())
    outcomes = []
    for entry in index["log"]:
        report = explain_files([str(CORPUS / entry["file"])])
        top = report.findings[0]
        outcomes.append(Outcome(entry["file"], entry["kind"], entry["cause"], top.cause, top.confidence or 0.0,
                                ranked_causes(report)))
    return outcomes


def figures(outcomes: list[Outcome]) -> dict[str, float]:
    identifies = [o for o in outcomes if o.kind == "identifies"]
    generic = [o for o in outcomes if o.kind == "generic"]
    return {
        "logs": len(outcomes),
        "identifies": len(identifies),
        "generic": len(generic),
        "top1_identifies": sum(o.top1 for o in identifies) / len(identifies),
        "top3_generic": sum(o.top3 for o in generic) / len(generic),
        "confidently_wrong": sum(o.confidently_wrong for o in outcomes),
    }


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    outcomes = evaluate()
    for o in outcomes:
        mark = "ok " if (o.top1 if o.kind == "identifies" else o.top3) else "MISS"
        print(f"{mark} {o.kind:10} {o.file:40} truth={o.truth:18} answer={o.answer:22} {o.confidence:.2f} {o.ranked[:3]}")
    f = figures(outcomes)
    print(f"{f['logs']} logs: top-1 on logs that identify their cause {f['top1_identifies']:.0%} "
          f"({f['identifies']}), true cause in top 3 on generic logs {f['top3_generic']:.0%} ({f['generic']}), "
          f"wrong at confidence >= {CONFIDENT}: {f['confidently_wrong']}")


if __name__ == "__main__":
    main()

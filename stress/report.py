"""Layer results and the report: one JSON file and one Markdown file with each layer's figures,
thresholds, checks and verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from stress.measure import LAYER_NAMES

Verdict = Literal["pass", "fail", "not measurable", "not run"]


class Check(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class LayerResult(BaseModel):
    layer: int
    name: str
    verdict: Verdict = "pass"
    seconds: float = 0.0
    figures: dict[str, Any] = Field(default_factory=dict)
    thresholds: dict[str, Any] = Field(default_factory=dict)
    checks: list[Check] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @classmethod
    def start(cls, layer: int) -> "LayerResult":
        return cls(layer=layer, name=LAYER_NAMES[layer])

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name=name, ok=bool(ok), detail=detail))
        return bool(ok)

    def settle(self) -> "LayerResult":
        """The verdict from the checks, unless already set to not measurable / not run."""
        if self.verdict in ("pass", "fail"):
            self.verdict = "pass" if self.checks and all(c.ok for c in self.checks) else "fail"
        return self


class StressReport(BaseModel):
    profile: str
    base_url: str
    quick: bool
    started_utc: str
    finished_utc: str = ""
    machine: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    layers: list[LayerResult] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(layer.verdict in ("pass", "not measurable") for layer in self.layers)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _table(rows: list[dict]) -> list[str]:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def render_markdown(report: StressReport) -> str:
    mode = "quick" if report.quick else "full"
    lines = [
        f"# poolserve stress: {report.profile} ({mode})",
        "",
        f"Target {report.base_url}; {report.started_utc} to {report.finished_utc}.",
        "",
    ]
    if report.machine:
        lines += ["Machine: " + "; ".join(f"{k} {_cell(v)}" for k, v in report.machine.items()) + ".", ""]
    lines += [f"- {note}" for note in report.notes] + ([""] if report.notes else [])
    lines += ["| layer | verdict | seconds |", "|---|---|---|"]
    lines += [f"| {r.layer}. {r.name} | **{r.verdict}** | {r.seconds:.0f} |" for r in report.layers]
    for r in report.layers:
        lines += ["", f"## {r.layer}. {r.name}: {r.verdict}", ""]
        if r.thresholds:
            lines += ["Thresholds: " + "; ".join(f"{k} = {_cell(v)}" for k, v in r.thresholds.items()) + ".", ""]
        for key, value in r.figures.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines += [f"**{key}**", ""] + _table(value) + [""]
            elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
                lines += [f"**{key}**", ""] + _table([{"": k, **v} for k, v in value.items()]) + [""]
            else:
                lines.append(f"- {key}: {_cell(value)}")
        if r.checks:
            lines += ["", "| check | result | detail |", "|---|---|---|"]
            lines += [f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail} |" for c in r.checks]
        lines += [f"- note: {note}" for note in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def write_report(report: StressReport, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "stress.json", out_dir / "stress.md"
    json_path.write_text(report.model_dump_json(indent=2))
    md_path.write_text(render_markdown(report))
    return json_path, md_path

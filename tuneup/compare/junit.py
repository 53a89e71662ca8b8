"""A comparison as JUnit XML, so that CI dashboards (GitLab, Jenkins, GitHub test reporters) show it as tests.

One testsuite; one testcase per compared metric (of `tuneup compare`, or of `tuneup bench --ab`), named by the metric. A REGRESSION is a <failure> whose
message names the metric and states the one effect figure (`MetricComparison.effect_text`) against its
threshold; an INCONCLUSIVE metric, or one not compared, is <skipped> with the reason; NO CHANGE and
IMPROVEMENT pass, their verdict in <system-out>. The elements and attributes are those of the common JUnit
schema (Jenkins xunit-plugin's junit-10.xsd; tests/data/junit-10.xsd holds the part written here).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from tuneup.compare.compare import Comparison
from tuneup.compare.rule import Verdict

SUITE_NAME = "tuneup compare"
CLASS_NAME = "tuneup.compare"


class MetricVerdict(Protocol):
    """What a testcase states: `tuneup compare`'s MetricComparison and the A/B's PairedComparison."""

    @property
    def metric(self) -> str: ...
    @property
    def verdict(self) -> Verdict: ...
    @property
    def effect_text(self) -> str: ...
    @property
    def threshold(self) -> float: ...
    @property
    def reason(self) -> str: ...


def _case(suite: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"name": name, "classname": CLASS_NAME, "time": "0"})


def _metric_case(suite: ET.Element, r: MetricVerdict) -> None:
    case = _case(suite, r.metric)
    summary = f"{r.metric}: {r.verdict.value}, {r.effect_text} (threshold {r.threshold:.1%})"
    if r.verdict is Verdict.REGRESSION:
        failure = ET.SubElement(case, "failure", {"type": r.verdict.value, "message": summary})
        failure.text = r.reason
    elif r.verdict is Verdict.INCONCLUSIVE:
        ET.SubElement(case, "skipped", {"type": r.verdict.value, "message": f"{summary}: {r.reason}"})
    else:
        ET.SubElement(case, "system-out").text = f"{summary}: {r.reason}"


def suite_xml(
    name: str,
    properties: Sequence[tuple[str, str]],
    results: Sequence[MetricVerdict],
    skipped: Mapping[str, str] | None = None,
    add_cases: Callable[[ET.Element], None] | None = None,
) -> str:
    """One testsuite: a testcase per metric verdict, a skipped one per metric not compared, then whatever
    `add_cases` adds (a JUnit XML document, text with its declaration)."""
    suite = ET.Element("testsuite", {"name": name})
    props = ET.SubElement(suite, "properties")
    for key, value in properties:
        ET.SubElement(props, "property", {"name": key, "value": value})
    for r in results:
        _metric_case(suite, r)
    for metric, why in (skipped or {}).items():
        ET.SubElement(_case(suite, metric), "skipped", {"message": f"{metric}: not compared, {why}"})
    if add_cases is not None:
        add_cases(suite)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(case.find("failure") is not None for case in cases)))
    suite.set("errors", "0")
    suite.set("skipped", str(sum(case.find("skipped") is not None for case in cases)))
    suite.set("time", "0")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def junit_xml(c: Comparison) -> str:
    """The comparison as a JUnit XML document (text, with its declaration)."""

    def to_target(suite: ET.Element) -> None:
        if c.to_target is None:
            return
        case = _case(suite, f"time to {c.to_target.target}")
        if c.to_target.regression:
            ET.SubElement(case, "failure", {"type": "SLOWER TO TARGET", "message": c.to_target.verdict})
        else:
            ET.SubElement(case, "system-out").text = c.to_target.verdict

    properties = (
        ("baseline", f"{c.baseline.label} ({len(c.baseline.runs)} run(s), {c.baseline.kind})"),
        ("candidate", f"{c.candidate.label} ({len(c.candidate.runs)} run(s), {c.candidate.kind})"),
        ("rule", c.rule.describe()),
    )
    return suite_xml(SUITE_NAME, properties, c.results, c.skipped, to_target)


def write_junit(document: Comparison | str, path: str | Path) -> None:
    """Write the JUnit XML (a comparison's, or a document's text) whole or not at all (a CI step that
    reads it never sees half a file)."""
    text = document if isinstance(document, str) else junit_xml(document)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)

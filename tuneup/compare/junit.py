"""A comparison as JUnit XML, so that CI dashboards (GitLab, Jenkins, GitHub test reporters) show it as tests.

One testsuite; one testcase per compared metric, named by the metric. A REGRESSION is a <failure> whose
message names the metric and states the one effect figure (`MetricComparison.effect_text`) against its
threshold; an INCONCLUSIVE metric, or one not compared, is <skipped> with the reason; NO CHANGE and
IMPROVEMENT pass, their verdict in <system-out>. The elements and attributes are those of the common JUnit
schema (Jenkins xunit-plugin's junit-10.xsd; tests/data/junit-10.xsd holds the part written here).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from tuneup.compare.compare import Comparison
from tuneup.compare.rule import MetricComparison, Verdict

SUITE_NAME = "tuneup compare"
CLASS_NAME = "tuneup.compare"


def _case(suite: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"name": name, "classname": CLASS_NAME, "time": "0"})


def _metric_case(suite: ET.Element, r: MetricComparison) -> None:
    case = _case(suite, r.metric)
    summary = f"{r.metric}: {r.verdict.value}, {r.effect_text} (threshold {r.threshold:.1%})"
    if r.verdict is Verdict.REGRESSION:
        failure = ET.SubElement(case, "failure", {"type": r.verdict.value, "message": summary})
        failure.text = r.reason
    elif r.verdict is Verdict.INCONCLUSIVE:
        ET.SubElement(case, "skipped", {"type": r.verdict.value, "message": f"{summary}: {r.reason}"})
    else:
        ET.SubElement(case, "system-out").text = f"{summary}: {r.reason}"


def junit_xml(c: Comparison) -> str:
    """The comparison as a JUnit XML document (text, with its declaration)."""
    suite = ET.Element("testsuite", {"name": SUITE_NAME})
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("baseline", f"{c.baseline.label} ({len(c.baseline.runs)} run(s), {c.baseline.kind})"),
        ("candidate", f"{c.candidate.label} ({len(c.candidate.runs)} run(s), {c.candidate.kind})"),
        ("rule", c.rule.describe()),
    ):
        ET.SubElement(properties, "property", {"name": name, "value": value})
    for r in c.results:
        _metric_case(suite, r)
    for metric, why in c.skipped.items():
        ET.SubElement(_case(suite, metric), "skipped", {"message": f"{metric}: not compared, {why}"})
    if c.to_target is not None:
        case = _case(suite, f"time to {c.to_target.target}")
        if c.to_target.regression:
            ET.SubElement(case, "failure", {"type": "SLOWER TO TARGET", "message": c.to_target.verdict})
        else:
            ET.SubElement(case, "system-out").text = c.to_target.verdict
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(case.find("failure") is not None for case in cases)))
    suite.set("errors", "0")
    suite.set("skipped", str(sum(case.find("skipped") is not None for case in cases)))
    suite.set("time", "0")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(c: Comparison, path: str | Path) -> None:
    """Write the JUnit XML whole or not at all (a CI step that reads it never sees half a file)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(junit_xml(c), encoding="utf-8")
    os.replace(tmp, out)

"""`tuneup compare` in CI: JUnit XML valid against the common schema, exit codes, the job summary."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.test_compare import cli, synthetic_run, synthetic_set
from tuneup.compare.compare import compare, format_table
from tuneup.compare.junit import junit_xml
from tuneup.compare.runs import load_side

XSD = Path(__file__).parent / "data" / "junit-10.xsd"
XS = "{http://www.w3.org/2001/XMLSchema}"

# -- a small validator of the schema's subset: elements, their children, attributes and types ---------------


def load_schema(path: Path) -> tuple[dict[str, dict], dict[str, re.Pattern[str]]]:
    """{element: {"children": refs, "attributes": {name: (required, type)}, "text": allowed}}, {type: pattern}.
    Enough of XML Schema for junit-10.xsd: named top-level elements, refs, attributes, pattern types."""
    root = ET.parse(path).getroot()
    types = {
        t.get("name"): re.compile(t.find(f"{XS}restriction/{XS}pattern").get("value"))  # type: ignore[union-attr]
        for t in root.findall(f"{XS}simpleType")
    }
    elements = {}
    for el in root.findall(f"{XS}element"):
        complex_type = el.find(f"{XS}complexType")
        elements[el.get("name")] = {
            "children": {e.get("ref") for e in el.iter(f"{XS}element") if e.get("ref")},
            "attributes": {
                a.get("name"): (a.get("use") == "required", a.get("type")) for a in el.iter(f"{XS}attribute")
            },
            "text": el.get("type") == "xs:string"
            or (complex_type is not None and complex_type.get("mixed") == "true"),
        }
    return elements, types  # type: ignore[return-value]


def schema_errors(element: ET.Element, path: Path = XSD) -> list[str]:
    elements, types = load_schema(path)
    errors: list[str] = []

    def check(e: ET.Element, where: str) -> None:
        spec = elements.get(e.tag)
        if spec is None:
            errors.append(f"{where}: element {e.tag} is not in the schema")
            return
        for name, (required, kind) in spec["attributes"].items():
            value = e.get(name)
            if value is None:
                if required:
                    errors.append(f"{where}: required attribute {name} missing")
            elif kind in types and not types[kind].fullmatch(value):
                errors.append(f"{where}: {name}={value!r} is not a {kind}")
        errors.extend(
            f"{where}: attribute {a} not in the schema" for a in e.attrib if a not in spec["attributes"]
        )
        if (e.text or "").strip() and not spec["text"]:
            errors.append(f"{where}: text not allowed")
        for child in e:
            if child.tag not in spec["children"]:
                errors.append(f"{where}: {child.tag} not allowed in {e.tag}")
            check(child, f"{where}/{child.tag}")

    check(element, element.tag)
    return errors


def test_the_validator_rejects_what_the_schema_does_not_allow() -> None:
    """The hand check must be able to fail: each broken document is rejected for the right reason."""
    assert schema_errors(ET.fromstring('<testsuite name="s" tests="0" failures="0" errors="0"/>')) == []
    broken = {
        '<testsuite name="s" tests="0" failures="0"/>': "required attribute errors missing",
        '<testsuite name="s" tests="0" failures="0" errors="0"><testcase/></testsuite>': "required attribute name",
        '<testsuite name="s" tests="1" failures="1" errors="0"><failure/></testsuite>': "failure not allowed in testsuite",
        '<testsuite name="s" tests="0" failures="0" errors="0" time="1.5s"/>': "is not a SUREFIRE_TIME",
        '<testsuite name="s" tests="0" failures="0" errors="0" verdict="x"/>': "attribute verdict not in the schema",
        '<testsuite name="s" tests="0" failures="0" errors="0">text</testsuite>': "text not allowed",
    }  # fmt: skip
    for document, reason in broken.items():
        errors = schema_errors(ET.fromstring(document))
        assert any(reason in e for e in errors), (document, errors)


# -- JUnit XML ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory):
    """Step time 20% slower (REGRESSION, and throughput with it), peak memory equal (NO CHANGE), cost per
    sample and exposed communication not recorded (skipped)."""
    root = tmp_path_factory.mktemp("mixed")
    base = synthetic_set(root / "base", [10.0, 10.1, 9.9, 10.05, 9.95])
    slower = synthetic_set(root / "slow", [12.0, 12.1, 11.9, 12.05, 11.95])
    return compare(load_side(base), load_side(slower))


def test_junit_xml_is_valid_and_says_each_metrics_verdict(mixed) -> None:
    text = junit_xml(mixed)
    suite = ET.fromstring(text)
    assert schema_errors(suite) == []
    assert suite.tag == "testsuite" and suite.get("name") == "tuneup compare"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["throughput", "step time", "peak memory", "cost_per_sample", "exposed_comm"]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "5",
        "2",
        "0",
        "2",
    )
    step = next(r for r in mixed.results if r.metric == "step time")
    failure = cases["step time"].find("failure")
    assert failure is not None and failure.get("type") == "REGRESSION"
    # The metric named, and the one effect figure the table shows (+20.0%) against its threshold.
    assert failure.get("message") == f"step time: REGRESSION, {step.effect_text} (threshold 5.0%)"
    assert step.effect_text == "+20.0%" and failure.text == step.reason
    table_row = next(
        line for line in format_table(mixed).splitlines() if line.strip().startswith("step time")
    )
    assert step.effect_text in table_row.split()
    memory = cases["peak memory"]
    assert memory.find("failure") is None and memory.find("skipped") is None
    assert memory.findtext("system-out", "").startswith("peak memory: NO CHANGE, +0.0% (threshold 2.0%)")
    skipped = cases["cost_per_sample"].find("skipped")
    assert skipped is not None and "not compared, a run is not priced" in skipped.get("message", "")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["rule"] == mixed.rule.describe() and "5 run(s)" in properties["baseline"]


def test_junit_inconclusive_is_skipped_with_the_reason(tmp_path: Path) -> None:
    a = synthetic_run(tmp_path / "a", 10.0)
    b = synthetic_run(tmp_path / "b", 13.0)
    result = compare(load_side(a), load_side(b), metrics=["step_time"])
    suite = ET.fromstring(junit_xml(result))
    assert schema_errors(suite) == []
    (case,) = suite.findall("testcase")
    skipped = case.find("skipped")
    assert skipped is not None and skipped.get("type") == "INCONCLUSIVE"
    assert skipped.get("message", "").startswith("step time: INCONCLUSIVE, +30.0% (threshold 5.0%): ")
    assert "a test needs at least 2 runs a side" in skipped.get("message", "")
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "1")


def test_junit_escapes_what_it_quotes(tmp_path: Path) -> None:
    """A side's path reaches the XML: markup in it must stay text."""
    odd = tmp_path / 'a<b>&"c'
    a = synthetic_set(odd / "base", [10.0, 10.1])
    b = synthetic_set(tmp_path / "cand", [10.0, 10.05])
    suite = ET.fromstring(junit_xml(compare(load_side(a), load_side(b), metrics=["throughput"])))
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert str(odd) in properties["baseline"] and schema_errors(suite) == []


# -- the command line: --junit, exit codes, the job summary --------------------------------------------------


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    return {
        "base": synthetic_set(root / "base", [10.0, 10.1, 9.9, 10.05, 9.95]),
        "same": synthetic_set(root / "same", [10.02, 9.98, 10.07, 9.93, 10.0]),
        "slow": synthetic_set(root / "slow", [12.0, 12.1, 11.9, 12.05, 11.95]),
        "fast": synthetic_set(root / "fast", [8.0, 8.1, 7.9, 8.05, 7.95]),
        "one": synthetic_set(root / "one", [13.0]),
    }


@pytest.mark.parametrize(
    ("candidate", "default", "detailed"),
    [("same", 0, 0), ("slow", 1, 1), ("one", 0, 3), ("fast", 0, 4)],
    ids=["no change", "regression", "inconclusive", "improvement"],
)
def test_exit_codes(sets: dict[str, Path], candidate: str, default: int, detailed: int) -> None:
    """0/1/2 by default, as CI jobs written for them expect; --detailed-exit-codes tells inconclusive (3)
    and improvement (4) apart."""
    args = ("compare", str(sets["base"]), str(sets[candidate]), "--metrics", "throughput,step_time")
    assert cli(*args).returncode == default
    assert cli(*args, "--detailed-exit-codes").returncode == detailed


def test_bad_input_is_2_with_detailed_exit_codes_too(sets: dict[str, Path], tmp_path: Path) -> None:
    proc = cli("compare", str(sets["base"]), str(tmp_path / "missing"), "--detailed-exit-codes")
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr


def test_junit_option_and_github_summary_state_one_figure_per_metric(
    sets: dict[str, Path], tmp_path: Path
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    junit = tmp_path / "reports" / "perf.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "tuneup", "compare", str(sets["base"]), str(sets["slow"]), "--junit", str(junit),
         "--github-summary", "--metrics", "throughput,step_time,peak_memory"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    suite = ET.parse(junit).getroot()
    assert schema_errors(suite) == [] and suite.get("failures") == "2"
    markdown = summary.read_text()
    assert markdown.startswith("earlier step\n**tuneup compare: 2 regression(s)**")
    figures = {"throughput": "-16.7%", "step time": "+20.0%", "peak memory": "+0.0%"}
    verdicts = {"throughput": "REGRESSION", "step time": "REGRESSION", "peak memory": "NO CHANGE"}
    for metric, effect in figures.items():
        # The same figure in the table's row, the verdict's line, the terminal and the JUnit case.
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {metric} |"))
        assert f"| {effect} |" in row and verdicts[metric] in row
        assert f"- {metric}: **{verdicts[metric]}**, {effect}: " in markdown
        assert re.search(rf"{metric}\s+{verdicts[metric]}\s.*\s{re.escape(effect)}\s", proc.stdout)
        case = next(c for c in suite.iter("testcase") if c.get("name") == metric)
        assert effect in ET.tostring(case, encoding="unicode")


# -- --history: the candidate's result appended for `tuneup regressions` ----------------------------------------


def test_history_appends_the_candidates_figures_commit_and_verdict(
    sets: dict[str, Path], tmp_path: Path
) -> None:
    from tuneup.compare.history import read

    history = tmp_path / "ci" / "history.jsonl"
    slow = tmp_path / "slow"
    for i, ms in enumerate([12.0, 12.1, 11.9]):
        synthetic_run(slow / f"run-{i}", ms, commit="0123456789abcdef0123456789abcdef01234567")
    json_out = tmp_path / "r.json"
    args = ("--metrics", "throughput,step_time,peak_memory", "--history", str(history))
    first = cli("compare", str(sets["base"]), str(slow), *args, "--json", str(json_out), cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    assert f"appended the candidate's figures to the history {history}" in first.stdout
    # Not a git checkout, and runs without a recorded commit: 'unknown', said rather than guessed.
    same = cli("compare", str(sets["base"]), str(sets["same"]), *args, cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    records = read(history)
    assert [(r.commit, r.verdict) for r in records] == [
        ("0123456789abcdef0123456789abcdef01234567", "regression"),
        ("unknown", "no_change"),
    ]
    compared = {m["metric"]: m for m in json.loads(json_out.read_text())["metrics"]}
    metrics = records[0].metrics
    # The figures the table prints as 'candidate' (geometric means of the runs').
    assert metrics["step_time_ms"] == pytest.approx(compared["step time"]["candidate_mean"], rel=1e-9)
    assert metrics["step_time_ms"] == pytest.approx((12.0 * 12.1 * 11.9) ** (1 / 3), rel=1e-9)
    assert metrics["samples_per_s"] == pytest.approx(compared["throughput"]["candidate_mean"], rel=1e-9)
    assert metrics["peak_memory_bytes"] == pytest.approx(100e6)
    assert "usd_per_million_samples" not in metrics and "exposed_comm_ms" not in metrics  # not recorded
    assert records[0].timestamp_unix <= records[1].timestamp_unix


def test_history_in_a_checkout_takes_its_commit_and_a_bad_location_is_exit_2(
    sets: dict[str, Path], tmp_path: Path
) -> None:
    from tuneup.compare.history import read

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    history = tmp_path / "history.jsonl"
    proc = cli("compare", str(sets["base"]), str(sets["fast"]), "--history", str(history), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    (record,) = read(history)
    assert (record.commit, record.branch, record.verdict) == (head, "main", "improvement")
    bad = cli("compare", str(sets["base"]), str(sets["same"]), "--history", str(tmp_path), cwd=repo)
    assert bad.returncode == 2 and "is a directory" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_appends_to_the_history_with_and_without_a_baseline(
    sets: dict[str, Path], tmp_path: Path
) -> None:
    """`tuneup bench --history`: a bench without a baseline still adds the candidate's point (no verdict);
    with one, the verdict too. The workload writes a synthetic run where TUNEUP_DIR says (no training)."""
    from tuneup.compare.history import read

    root = Path(__file__).parent.parent
    code = (
        f"import os, sys; sys.path.insert(0, {str(root)!r}); from pathlib import Path; "
        "from tests.test_compare import synthetic_run; synthetic_run(Path(os.environ['TUNEUP_DIR']), 12.0)"
    )
    workload = f"{sys.executable} -c {shlex.quote(code)}"
    history = tmp_path / "history.jsonl"
    alone = cli(
        "bench", "--cmd", workload, "--runs", "2", "--out", str(tmp_path / "a"), "--history", str(history)
    )
    assert alone.returncode == 0, alone.stdout + alone.stderr
    against = cli(
        "bench", "--cmd", workload, "--runs", "2", "--out", str(tmp_path / "b"), "--history", str(history),
        "--baseline", str(sets["base"]), "--metrics", "step_time",
    )  # fmt: skip
    assert against.returncode == 1, against.stdout + against.stderr
    records = read(history)
    assert [r.verdict for r in records] == [None, "regression"]
    assert all(r.metrics["step_time_ms"] == pytest.approx(12.0) for r in records)

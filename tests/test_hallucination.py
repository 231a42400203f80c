"""Hallucination judges against a real HTTP server on 127.0.0.1 speaking chat completions, and the task end to end."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import SHARED_DATASETS, EngineLog, pair_options, run_cli, run_cli_in_process
from diffeval.data import hallucination as data
from diffeval.errors import InputError
from diffeval.judges import ChatJudge, JudgeError, JudgeItem, OverlapJudge, VerdictCache, make_judge, parse_verdict
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.tasks.conversations import hallucination, hallucination_options, hallucination_report, judging
from diffeval.tasks.conversations import prompts as conversation_prompts

SECRET = "sk-test-never-on-disk-4242"
ITEM = JudgeItem(
    "summary",
    "The council approved 12 new homes in Cardiff.",
    "",
    "Twelve homes were approved.",
    "The council approved 12 homes in Cardiff.",
)


class ScriptedServer:
    """Chat completions on 127.0.0.1 answering from a script: reply, HTTP status, slow reply or raw text."""

    def __init__(self):
        self.script: list[tuple] = []
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                action = server.script.pop(0) if server.script else ("reply", "Verdict: yes\nRationale: supported.")
                if action[0] == "status":
                    self.send_response(action[1])
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                if action[0] == "sleep":
                    time.sleep(action[1])
                    action = ("reply", action[2])
                payload = (
                    action[1]
                    if action[0] == "raw"
                    else json.dumps({"choices": [{"message": {"role": "assistant", "content": action[1]}}]})
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    scripted = ScriptedServer()
    yield scripted
    scripted.close()


def _judge(server, tmp_path, **kwargs):
    return ChatJudge(
        VerdictCache(tmp_path / "cache"),
        server.url,
        "judge-model",
        f"openai-compatible:{server.url}#m",
        False,
        **{"timeout": 5.0, "retries": 3, "backoff": 0.01, **kwargs},
    )


def test_normal_verdicts(server, tmp_path):
    server.script = [
        ("reply", "Verdict: yes\nRationale: every claim is in the document."),
        ("reply", "Verdict: no\nRationale: the number is wrong."),
    ]
    judge = _judge(server, tmp_path, concurrency=1)
    other = JudgeItem("summary", ITEM.source, "", ITEM.reference, "The council approved 40 homes.")
    first, second = judge.judge([ITEM, other])
    assert first.hallucination_free is True and "every claim" in first.rationale
    assert second.hallucination_free is False
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "judge-model"
    assert "Cardiff" in request["body"]["messages"][0]["content"]


def test_malformed_reply_is_unparsed_not_guessed(server, tmp_path):
    server.script = [("reply", "I think it might be fine, hard to say."), ("raw", "<html>oops</html>")]
    judge = _judge(server, tmp_path, concurrency=1)
    verdicts = judge.judge([ITEM, JudgeItem("answer", "doc", "q?", "ref", "out")])
    assert [v.hallucination_free for v in verdicts] == [None, None]


def test_429_then_success(server, tmp_path):
    server.script = [("status", 429), ("status", 503), ("reply", "Verdict: yes")]
    assert _judge(server, tmp_path).judge([ITEM])[0].hallucination_free is True
    assert len(server.requests) == 3


def test_timeout_is_retried(server, tmp_path):
    server.script = [("sleep", 1.5, "Verdict: no"), ("reply", "Verdict: yes")]
    verdict = _judge(server, tmp_path, timeout=0.5).judge([ITEM])[0]
    assert verdict.hallucination_free is True and len(server.requests) == 2


def test_gives_up_with_a_clear_error(server, tmp_path):
    server.script = [("status", 503)] * 10
    with pytest.raises(JudgeError, match="failed after 3 attempts \\(HTTP 503\\)"):
        _judge(server, tmp_path, retries=2).judge([ITEM])


def test_cache_answers_repeats_without_requests(server, tmp_path):
    judge = _judge(server, tmp_path)
    judge.judge([ITEM])
    again = _judge(server, tmp_path)  # a new process would open the same file
    assert again.judge([ITEM])[0].hallucination_free is True
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Verdict: yes", True),
        ("verdict: NO.\nRationale: x", False),
        ("**Verdict:** Yes", True),
        ("  Verdict - no!  ", False),
        ('{"verdict": "yes"}', True),
        ('{"hallucination_free": false}', False),
        ('```json\n{"verdict": "no"}\n```', False),
        ('"Verdict: yes" or "Verdict: no"', None),  # echoes the instruction: not a verdict
        ("Verdict: yes\nVerdict: no", None),  # both answers
        ("verdict - NO. Rationale: x", None),  # not a line of its own
        ("The verdict is yes.", None),
        ("No, it adds a name.", None),
        ("maybe", None),
        ("", None),
    ],
)
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply).hallucination_free is expected


def test_overlap_proxy_counts_unsupported_units(tmp_path):
    judge = OverlapJudge(VerdictCache(tmp_path))
    source = "The council in Cardiff approved 12 new homes on Monday after a long debate."
    assert judge.unsupported_share("The council approved 12 new homes.", source) == 0.0
    assert judge.unsupported_share("Swansea council rejected 40 flats.", source) > 0.5
    assert judge.judge([ITEM])[0].hallucination_free is True and judge.kind == "proxy"


def test_bad_judge_specs(monkeypatch, tmp_path):
    for spec in ("gpt4", "openai:", "openai-compatible:localhost#m", "hf:"):
        with pytest.raises(InputError, match="bad --judge"):
            make_judge(spec, str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InputError, match="needs OPENAI_API_KEY"):
        make_judge("openai:gpt-4o", str(tmp_path))


def test_hf_judge_scores_yes_against_no(tiny_models, tmp_path):
    judge = make_judge(f"hf:{tiny_models['base_a']}", str(tmp_path), device="cpu")
    verdict = judge.judge([ITEM])[0]
    assert isinstance(verdict.hallucination_free, bool) and "log P(yes)" in verdict.rationale


def test_middle_truncation_keeps_both_ends(tiny_models):
    backend = HFBackend(load_model(ModelSpec("base", str(tiny_models["base"])), "cpu"))
    words = " ".join(f"w{i}" for i in range(3000))
    doc = data.Document("1", "START " + words + " FINISH", "", "ref")
    ids, cut = conversation_prompts.fit_prompt(data.SPECS["xsum"], doc, backend, 500)
    text = backend.tokenizer.decode(ids)
    assert len(ids) <= 500 and cut > 0
    assert "START" in text and "FINISH" in text and "Summarize the document above" in text


@pytest.fixture(scope="module")
def local_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("halluc")
    rows = [
        {
            "document": f"Prison Link Cymru had {1000 + i} referrals in 2015. Workers said housing helps.",
            "summary": "A charity wants more housing.",
            "id": str(i),
        }
        for i in range(3)
    ]
    (root / "xsum_lookbacklens_200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    qa = [
        {
            "input": "Who founded the club?",
            "context": "Passage 1:\nThe club was founded by Ann Lee in 1901.",
            "answers": ["Ann Lee"],
            "length": 12,
            "dataset": "hotpotqa",
            "language": "en",
            "all_classes": None,
            "_id": f"q{i}",
        }
        for i in range(2)
    ]
    (root / "longbench_hotpotqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    return root


@pytest.mark.slow
def test_cli_with_api_judge_never_writes_the_key(server, tiny_models, local_data, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    out, cache = tmp_path / "run", tmp_path / "cache"
    server.script = [("reply", "Verdict: no\nRationale: invented."), ("reply", "garbage")]
    args = [
        "run",
        "hallucination",
        *pair_options(tiny_models),
        "--dataset",
        "xsum,hotpotqa",
        "--samples",
        "2",
        "--ctx",
        "1k",
        "--data-dir",
        str(local_data),
        "--judge",
        f"openai-compatible:{server.url}#judge-model",
        "--judge-cache",
        str(cache),
        "--judge-concurrency",
        "1",
        "--out",
        str(out),
    ]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert all(r["auth"] == f"Bearer {SECRET}" for r in server.requests)
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {r["dataset"] for r in records} == {"xsum", "hotpotqa"}
    assert [r["verdict"] for r in records[:2]] == [False, None]
    table = (out / "table.md").read_text()
    assert "Table 4 layout: fraction judged hallucination-free" in table and "unparsed_verdicts" in table
    for path in [*out.rglob("*"), *cache.rglob("*")]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in result.stdout + result.stderr
    requests = len(server.requests)
    assert run_cli("report", str(out)).returncode == 0
    server.script = [("reply", "garbage again")]
    rerun = run_cli(*args[:-2], "--out", str(tmp_path / "again"))  # same prompts: parsed verdicts from the cache
    assert rerun.returncode == 0 and len(server.requests) == requests + 1  # the unparsed one is asked again


@pytest.mark.slow
def test_judge_failure_keeps_finished_samples(server, tiny_models, local_data, tmp_path):
    server.script = [("reply", "Verdict: yes")] + [("status", 500)] * 50
    out = tmp_path / "fail"
    result = run_cli(
        "run",
        "hallucination",
        "-m",
        f"diff={tiny_models['diff']}",
        "--dataset",
        "xsum,hotpotqa",
        "--samples",
        "2",
        "--ctx",
        "1k",
        "--data-dir",
        str(local_data),
        "--judge-retries",
        "1",
        "--judge",
        f"openai-compatible:{server.url}#m",
        "--judge-cache",
        str(tmp_path / "c"),
        "--judge-concurrency",
        "1",
        "--out",
        str(out),
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("error: judge") and "failed after 2 attempts" in last
    assert "Traceback" not in result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["verdict"] for r in records] == [True]  # the sample judged before the failure is kept
    generated = (out / "generations.jsonl").read_text()
    server.script = [("reply", "Verdict: yes")] * 10
    again = run_cli(*result.args[3:])  # the same command: judges what is left, generates nothing again
    assert again.returncode == 0, again.stderr
    assert (out / "generations.jsonl").read_text() == generated
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["verdict"] is True for r in records)


@pytest.mark.slow
def test_one_engine_at_a_time_and_the_local_judge_loads_last(tiny_models, local_data, tmp_path, monkeypatch):
    from rich.console import Console

    from diffeval import runner
    from diffeval.tasks import build_config

    log = EngineLog(monkeypatch, HFBackend, held=lambda backend: backend.model)
    generate_calls = []
    generate = HFBackend.generate
    monkeypatch.setattr(HFBackend, "generate", lambda b, p, *a: generate_calls.append(len(p)) or generate(b, p, *a))
    flags = {
        "models": [f"diff={tiny_models['diff']}", f"base={tiny_models['base']}"],
        "datasets": "xsum",
        "samples": 3,
        "ctx": "1k",
        "data_dir": str(local_data),
        "judge": f"hf:{tiny_models['base_a']}",
        "judge_cache": str(tmp_path / "cache"),
        "batch_size": 4,
        "device": "cpu",
        "out": str(tmp_path / "run"),
    }
    folder = runner.run(build_config("hallucination", {}, flags), Console(quiet=True))
    # each model loads after the one before is closed and collected; the judge only after both, once
    assert log.events == [
        ("load", "diff", []), ("close", "diff", None), ("load", "base", []), ("close", "base", None),
        ("load", "judge", []), ("close", "judge", None),
    ]  # fmt: skip
    assert log.alive() == []  # the judge's model too, once it is closed
    assert generate_calls == [3, 3]  # a whole chunk per generate call
    records = folder.read_records().rows
    assert len(records) == 6 and all(r["judge"].startswith("hf:") and r["verdict"] in (True, False) for r in records)


def test_judge_is_required(tiny_models):
    result = run_cli_in_process("run", "hallucination", "-m", f"diff={tiny_models['diff']}")
    assert result.returncode == 2 and "--judge is required" in result.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_real_xsum_with_overlap_judge(tiny_models, tmp_path):
    folder = SHARED_DATASETS / "hallucination"
    if not (folder / "xsum_lookbacklens_200.jsonl").is_file():
        pytest.skip(f"{folder} absent: the shared datasets are only on CI and dev machines")
    out = tmp_path / "xsum"
    result = run_cli(
        "run",
        "hallucination",
        *pair_options(tiny_models),
        "--dataset",
        "xsum",
        "--samples",
        "3",
        "--ctx",
        "2k",
        "--data-dir",
        str(folder),
        "--judge",
        "overlap",
        "--judge-cache",
        str(tmp_path / "c"),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    table = (out / "table.md").read_text()
    assert "PROXY" in table and "not a hallucination rate" in table
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert records[0]["id"] == "38264402" and all(r["judge_kind"] == "proxy" for r in records)


@pytest.mark.slow
def test_a_run_whose_every_verdict_is_unparsed_writes_counts_and_tables(server, tiny_models, local_data, tmp_path):
    server.script = [("reply", "I would rather not say.")] * 10
    out = tmp_path / "unparsed"
    result = run_cli(
        "run", "hallucination", "-m", f"diff={tiny_models['diff']}", "--dataset", "xsum", "--samples", "2",
        "--ctx", "1k", "--data-dir", str(local_data), "--judge", f"openai-compatible:{server.url}#m",
        "--judge-cache", str(tmp_path / "c"), "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    table = (out / "table.md").read_text()
    assert "Judging: samples, outcomes" in table and "unparsed verdict is excluded from its model's accuracy" in table
    judging = (out / "judging.csv").read_text().splitlines()
    assert judging[0] == "model,dataset,samples,faithful,hallucinated,degenerate,unparsed_verdicts,truncated,judge"
    assert judging[1].startswith("diff,xsum,2,0,0,0,2,")
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["verdict"] for r in records] == [None, None]


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("", "empty output"),
        ("  \n ", "whitespace-only output"),
        ("the the the the", "degenerate output: 'the' repeated 4 times"),
        ("I think. I think. I think. I think. I think.", "degenerate output: 'I think.' repeated 5 times"),
        ("Council approves homes. homes homes homes homes", "degenerate output: 'homes' repeated 4 times"),
        ("Yes yes yes.", None),  # three in a row is not yet a loop
        ("The council approved 12 new homes in Cardiff on Monday, after a long debate.", None),
        ("A long summary of the council's decision on housing in Cardiff, very very very very close.", None),
    ],
)
def test_degenerate_outputs_are_their_own_outcome(output, reason):
    assert judging.degenerate(output) == reason


def test_cohen_kappa():
    import numpy as np

    a, b = np.array([True, True, False, False]), np.array([True, False, False, False])
    assert judging.cohen_kappa(a, b) == pytest.approx(0.5)  # observed 0.75, chance 0.5
    assert judging.cohen_kappa(a, a) == 1.0 and np.isnan(judging.cohen_kappa(a[:0], a[:0]))


def test_degenerate_outputs_are_never_judged_and_further_judges_are_compared(server, local_data, tmp_path):
    """A degenerate output scores 0 without reaching any judge; a second judge's verdicts sit in the same records and
    the report gives its agreement with the primary (Cohen's kappa, bootstrap CI)."""
    import pandas as pd

    from diffeval.records import Record
    from diffeval.tasks import build_config

    config = build_config("hallucination", {}, {
        "models": ["a/b"], "datasets": "xsum", "samples": 3, "data_dir": str(local_data),
        "judge": ["overlap", f"openai-compatible:{server.url}#second"], "judge_cache": str(tmp_path / "cache"),
        "judge_concurrency": 1,
    })  # fmt: skip
    documents = data.load("xsum", str(local_data), 3)
    faithful = documents[0].context.split(".")[0] + "."  # a sentence of the document: the overlap proxy passes it
    outputs = [faithful, "council council council council", documents[2].reference + " In Paris."]
    rows = [
        Record(
            "hallucination",
            "m",
            f"s{i}",
            100,
            10,
            0.1,
            {"dataset": "xsum", "id": d.id, "truncated_tokens": 0, "output": o},
        ).to_dict()  # fmt: skip
        for i, (d, o) in enumerate(zip(documents, outputs))
    ]
    server.script = [("reply", "Verdict: yes"), ("reply", "Verdict: no")]
    records = [r.to_dict() for r in hallucination.judge(rows, config)]
    assert len(server.requests) == 2  # the degenerate output reached no judge
    assert [r["outcome"] for r in records] == ["faithful", "degenerate", records[2]["outcome"]]
    assert records[1]["score"] == 0.0 and records[1]["verdict"] is None
    second = f"openai-compatible:{server.url}#second"
    assert [r["other_verdicts"] for r in records] == [{second: True}, {second: None}, {second: False}]
    tables = hallucination_report.tables(pd.DataFrame(records), hallucination_options.HallucinationOptions())
    judges = tables["judges"]
    assert list(judges.index) == ["overlap@0.25", second] and judges.loc[second, "both judged"] == 2
    assert {"kappa", "kappa_low", "kappa_high", "accuracy m"} <= set(judges.columns)
    assert tables["table4_proxy"].loc["m", "degenerate"] == 1


def test_a_budget_smaller_than_the_template_alone_is_one_line_not_a_hang(tiny_models):
    """Cutting the document cannot help when the template and question alone exceed the budget."""
    from diffeval.models.checkpoints.loading import load_tokenizer
    from diffeval.models.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(load_tokenizer(ModelSpec.parse(f"m={tiny_models['diff']}")))
    spec = data.SPECS["qasper"]
    document = data.Document(id="d", context="A long article. " * 200, question="What is it about?", reference="x")
    with pytest.raises(InputError, match="the prompt without any document takes"):
        conversation_prompts.fit_prompt(spec, document, tokenizer, 20)


def test_the_default_samples_take_every_document_where_a_dataset_holds_fewer():
    """--samples' default (100) is a ceiling: a 2-document fixture gives 2 samples; a given 3 is refused."""
    fixtures = str(Path(hallucination.__file__).parents[2] / "fixtures")
    options = hallucination_options.HallucinationOptions(datasets=["hotpotqa"], data_dir=fixtures, judge=["overlap"])
    assert options.samples == hallucination_options.SAMPLES
    assert len(hallucination.make_samples(options, seed=0)) == 2
    given = hallucination_options.HallucinationOptions(
        datasets=["hotpotqa"], data_dir=fixtures, judge=["overlap"], samples=3
    )
    with pytest.raises(InputError, match="--samples 3: hotpotqa holds 2 documents: give --samples 2 or fewer"):
        hallucination.make_samples(given, seed=0)

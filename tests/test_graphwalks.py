"""GraphWalks: the generated graphs against a BFS written here, token-exact fitting on two tokenizers, parsing and F1
against lm-eval's own functions, the openai/graphwalks loader, and the command line on the built-in pair."""

import json
import random
from pathlib import Path

import pytest

from conftest import pair_options, run_cli_in_process
from diffeval.data import graphwalks as data
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec
from diffeval.models.tokenizer import HFTokenizer
from diffeval.tasks.base import RunContext
from diffeval.tasks.generated import graphwalks, graphwalks_report
from diffeval.tasks.generated.fitting import Renderer
from diffeval.tasks.generated.graphwalks_options import GraphwalksOptions
from diffeval.tasks.thinking import UNCLOSED

FIXTURES = Path(data.__file__).resolve().parents[1] / "fixtures"


def layer(edges, start, depth):
    """Nodes at shortest distance exactly `depth` from `start`: a BFS level by level, written apart from the task's."""
    seen, frontier = {start}, {start}
    for _ in range(depth):
        frontier = {t for s, t in edges if s in frontier} - seen
        seen |= frontier
    return sorted(frontier - {start})


def in_nodes(edges, node):
    return sorted({s for s, t in edges if t == node} - {node})


@pytest.mark.parametrize("operation,depth", [("bfs", 1), ("bfs", 2), ("bfs", 3), ("parents", 0)])
def test_the_answer_is_the_subgraphs_on_every_cut_after_the_span(operation, depth):
    for index in range(5):
        graph = data.make_graph(data.graph_key(7, 4096, operation, depth, index), operation, depth, 8, 3, 40)
        assert graph.answer and max(graph.positions) < 40
        expected = layer(graph.core, graph.node, depth) if operation == "bfs" else in_nodes(graph.core, graph.node)
        assert list(graph.answer) == expected
        for count in (40, 41, 97, 400):
            edges = graph.edges(count)
            assert len(edges) == count and edges[:40] == graph.edges(40)  # one stream: a longer cut extends it
            found = layer(edges, graph.node, depth) if operation == "bfs" else in_nodes(edges, graph.node)
            assert found == expected, (index, count)
        assert all(len(name) == data.NAME_CHARS and int(name, 16) >= 0 for edge in graph.edges(100) for name in edge)


def test_networkx_agrees_where_installed():
    nx = pytest.importorskip("networkx")
    graph = data.make_graph("nx", "bfs", 2, 10, 3, 60)
    edges = graph.edges(300)
    distances = nx.single_source_shortest_path_length(nx.DiGraph(edges), graph.node)
    assert sorted(n for n, d in distances.items() if d == 2) == data.bfs_layer(edges, graph.node, 2)


def test_a_depth_no_subgraph_reaches_is_one_line():
    with pytest.raises(data.InputError, match="--nodes 2 and --degree 1 reached depth 5"):
        data.make_graph("deep", "bfs", 5, 2, 1, 10)


@pytest.fixture(scope="module")
def backends(tiny_models):
    """The tiny DIFF model and its baseline: two tokenizers with different vocabularies."""
    return {name: HFBackend(load_model(ModelSpec(name, str(tiny_models[name])), "cpu")) for name in ("diff", "base")}


def _tokenizers(backends):
    return {name: HFTokenizer(backend.tokenizer) for name, backend in backends.items()}


def _context(lengths, **options):
    return RunContext("graphwalks", GraphwalksOptions(ctx=lengths, **options), lengths, 0, None, False, None, [],
                      False, "cpu")  # fmt: skip


def test_each_model_fills_its_budget_with_the_same_stream(backends):
    context = _context([4096])
    spans = graphwalks.prepare(context, _tokenizers(backends))
    samples = graphwalks.make_samples(context.options, 0, 2, spans)
    budget = 4096 - graphwalks.answer_budget(context)
    for sample in samples:
        streams = []
        for backend in backends.values():
            renderer = Renderer(backend, False)
            user, edges = graphwalks.user_message(sample, renderer, budget)
            tokens = len(renderer.ids(user))
            longer = data.prompt_text(sample.graph.edges(len(edges) + 1), sample.operation, sample.graph.node,
                                      sample.depth)  # fmt: skip
            assert tokens <= budget < len(renderer.ids(longer))  # the most edges that fit
            assert budget - tokens <= 0.01 * 4096  # within 1 % of the length (an edge line is < 41 tokens here)
            assert data.answer_of(edges, sample.operation, sample.graph.node, sample.depth) == list(sample.graph.answer)
            streams.append(edges)
        shorter = min(streams, key=len)
        assert all(s[: len(shorter)] == shorter for s in streams) and len({len(s) for s in streams}) == 2


def test_a_subgraph_larger_than_the_context_holds_names_the_most_that_fits(backends):
    with pytest.raises(data.InputError, match=r"--nodes 60 × --degree 2 = 120 edges: context 4096 holds \d+ edges on "
                       r"model \w+, the answer's graph at most \d+: use --nodes \d+ or fewer"):  # fmt: skip
        graphwalks.prepare(_context([4096], nodes=60), _tokenizers(backends))
    with pytest.raises(data.InputError, match=r"answer budget of 4816 tokens \(16 \+ 12 per --nodes"):
        graphwalks.prepare(_context([5000], nodes=400), _tokenizers(backends))


OUTPUTS = [
    "Final Answer: [a1, b2]",
    "thinking...\nFinal Answer: ['a1', \"c3\"]\n",
    "Final Answer: [a1, b2]\nsome trailing text",
    "Final Answer: []",
    "final answer: [a1]",
    "Final Answer:[a1,b2,b2]",
    "no answer at all",
    "",
]


@pytest.mark.parametrize("output", OUTPUTS)
def test_parse_and_f1_agree_with_lm_evals_own(output):
    utils = pytest.importorskip("lm_eval.tasks.graphwalks.utils")
    for answer in (["a1", "b2"], ["c3"]):
        theirs = utils.process_results({"answer_nodes": answer}, [output])
        assert graphwalks_report.scored_fields(output, answer, "strict")["score"] == pytest.approx(theirs["f1"])
        assert graphwalks_report.scored_fields(output, answer, "flexible")["score"] == pytest.approx(
            theirs["flexible_f1"]
        )
    assert graphwalks_report.parse(output) == utils.extract_answer_list(output)
    assert graphwalks_report.parse(output, "flexible") == utils.extract_answer_list_flexible(output)


def test_precision_and_recall():
    fields = graphwalks_report.scored_fields("Final Answer: [a, b, x]", ["a", "b", "c", "d"])
    assert (fields["precision"], fields["recall"], fields["parse_error"]) == (pytest.approx(2 / 3), 0.5, False)
    assert fields["score"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))


def test_the_fixture_and_a_parquet_file_load_the_same_rows(tmp_path):
    import pandas as pd

    rows = data.load_rows(str(FIXTURES))
    assert {r.operation for r in rows} == {"bfs", "parents"} and all(r.answer and r.edges for r in rows)
    for row in rows:  # the fixture's answers are what its own edge lists give
        edges = [tuple(line.split(" -> ")) for line in data.graph_of(row.prompt).splitlines() if " -> " in line]
        assert list(row.answer) == data.answer_of(edges, row.operation, row.node, row.depth)
    frame = pd.read_json(FIXTURES / "graphwalks.jsonl", lines=True)
    (tmp_path / "parquet").mkdir()
    frame.to_parquet(tmp_path / "parquet" / data.HUB_FILE)
    assert data.load_rows(str(tmp_path / "parquet")) == rows


def test_the_package_ships_the_fixture():
    text = (FIXTURES.parent.parent / "pyproject.toml").read_text()
    assert '"fixtures/*.jsonl"' in text and (FIXTURES / "graphwalks.jsonl").is_file()
    assert "graphwalks.jsonl" in (FIXTURES / "README.md").read_text()


def _rows(tmp_path, rows, name="graphwalks.jsonl"):
    folder = tmp_path / "rows"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return str(folder)


@pytest.mark.parametrize("case,message", [
    ("missing", "no graphwalks*.parquet or graphwalks*.jsonl file there"),
    ("malformed", "line 1 is not JSON"),
    ("schema", "lacks prompt, answer_nodes or problem_type"),
    ("parquet", "not a readable parquet file"),
    ("parquet_schema", "lacks column(s) prompt, answer_nodes, problem_type: give rows in the schema of"),
])  # fmt: skip
def test_bad_data_is_one_line_through_the_command_line(case, message, tmp_path):
    if case == "missing":
        folder = str(tmp_path)
    elif case == "parquet":
        folder = _rows(tmp_path, ["not parquet"], "graphwalks.parquet")
    elif case == "parquet_schema":
        import pandas as pd

        (tmp_path / "rows").mkdir()
        pd.DataFrame({"input": ["x"], "answers": [["a"]]}).to_parquet(tmp_path / "rows" / data.HUB_FILE)
        folder = str(tmp_path / "rows")
    else:
        folder = _rows(tmp_path, ["{not json\n"] if case == "malformed" else [{"input": "x", "answers": ["a"]}])
    result = run_cli_in_process("run", "graphwalks", "--source", "openai", "--data-dir", folder, "--ctx", "1k",
                                "--out", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--ctx", "2k", "--nodes", "40"], "--nodes 40 × --degree 2 = 80 edges: context 2048 holds"),
    (["--ctx", "300"], "context 300 leaves no room for a prompt: use at least"),
    (["--ctx", "1k", "--max-new-tokens", "400"], "prompt holds no edge beside the answer budget of 400 tokens"),
    (["--operations", "walk"], "--operations walk: use bfs, parents"),
    (["--depths", "0"], "--depths 0: give BFS depths of at least 1"),
    (["--source", "hub"], "--source 'hub': use one of generated, openai"),
    (["--data-dir", "x"], "--data-dir"),
    (["--source", "openai", "--nodes", "5"], "--nodes"),
])  # fmt: skip
def test_bad_options_are_one_line(args, message, tmp_path):
    result = run_cli_in_process("run", "graphwalks", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_the_built_in_pair_runs_the_default_at_2k_and_resumes(tmp_path):
    out = tmp_path / "run"
    first = run_cli_in_process("run", "graphwalks", "--ctx", "2k", "--samples", "1", "--out", str(out))
    assert first.returncode == 0, first.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 and {r["model"] for r in records} == {"diff", "base"}
    for record in records:  # the answer the model's own prompt gives, the subgraph's
        assert record["answer_nodes"] and record["edges"] >= record["span"] >= 8 and "score" in record
    by_sample = {}
    for record in records:
        by_sample.setdefault(record["sample_id"], set()).add(tuple(record["answer_nodes"]))
    assert all(len(answers) == 1 for answers in by_sample.values())  # the same answer on both models' cuts
    assert "F1, precision and recall by length and operation" in first.stdout and "Paired" in first.stdout
    again = run_cli_in_process("run", "graphwalks", "--ctx", "2k", "--samples", "1", "--out", str(out))
    assert again.returncode == 0 and len((out / "samples.jsonl").read_text().splitlines()) == 6
    flexible = run_cli_in_process("report", str(out), "--scoring", "flexible")
    assert flexible.returncode == 0 and "[scoring: flexible]" in flexible.stdout


def test_the_fixture_runs_offline_and_counts_rows_no_length_holds(tiny_models, tmp_path):
    out = tmp_path / "rows"
    result = run_cli_in_process("run", "graphwalks", *pair_options(tiny_models), "--source", "openai",
                                "--data-dir", "package:fixtures", "--ctx", "1k,2k", "--max-new-tokens", "8",
                                "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    rows = data.load_rows(str(FIXTURES))
    assert len(records) == 2 * len(rows)
    too_long = [r for r in records if r.get("outcome") == graphwalks_report.TOO_LONG]
    assert all(r["score"] is None and r["ctx"] == 2048 for r in too_long)
    ran = [r for r in records if r.get("outcome") != graphwalks_report.TOO_LONG]
    assert ran and all(r["answer_nodes"] == list(rows[r["index"]].answer) for r in ran)


def test_the_view_marks_the_asked_node_and_the_answer(tmp_path):
    out = tmp_path / "run"
    assert run_cli_in_process("run", "graphwalks", "--ctx", "2k", "--samples", "1", "--operations", "parents",
                              "--out", str(out)).returncode == 0  # fmt: skip
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    context = _context([2048], operations=["parents"])
    document = graphwalks_report.sample_view(context, {r["model"]: r for r in records}, None, None).to_json()
    text = json.dumps(document)
    assert '"kind": "asked-node"' in text and '"kind": "answer-edge"' in text
    assert records[0]["answer_nodes"][0] in text and "precision" in text


def test_make_samples_is_pure_and_seeded():
    options, spans = GraphwalksOptions(ctx=[4096]), {4096: 50}
    first = graphwalks.make_samples(options, 3, None, spans)
    assert [s.sample_id for s in first] == [s.sample_id for s in graphwalks.make_samples(options, 3, None, spans)]
    assert {s.sample_id for s in first}.isdisjoint(
        s.sample_id for s in graphwalks.make_samples(options, 4, None, spans)
    )
    assert len({s.sample_id for s in first}) == len(first) == 3 * options.samples
    rng = random.Random(0)
    sample = rng.choice(first)
    assert sample.graph.edges(60)[:50] == sample.graph.edges(50)


@pytest.mark.slow
def test_a_thinking_model_answers_after_its_thinking_or_is_cut(tiny_models, tmp_path):
    """Scripted reasoning models (tests/thinking_models.py): one closes its thinking and answers, one never closes it
    (no answer, no score, counted in every table)."""
    from thinking_models import scripted_models

    models = scripted_models(tmp_path / "scripted", tiny_models["tok_a"])
    out = tmp_path / "think"
    result = run_cli_in_process("run", "graphwalks", "-m", f"answers={models['answers']}", "-m",
                                f"loops={models['loops']}", "--ctx", "2k", "--samples", "1", "--operations", "parents",
                                "--chat-template", "--thinking-budget", "24", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {r["model"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    answers, loops = rows["answers"], rows["loops"]
    assert answers["thinking_closed"] and answers["score"] is not None and answers["parse_error"] is True
    assert loops["outcome"] == UNCLOSED and loops["score"] is None and loops["thinking_tokens"] == 24
    assert loops["new_tokens"] == 24 and loops["prompt_tokens"] <= 2048 - 24 - graphwalks.ANSWER_BASE
    assert "answers 0, loops 1 samples" in (out / "table.md").read_text()


@pytest.mark.parametrize("source", [[], ["--source", "openai", "--data-dir", "package:fixtures"]])
def test_the_dry_run_sizes_both_sources(source, tmp_path):
    result = run_cli_in_process("run", "graphwalks", "--ctx", "2k,4k", *source, "--dry-run", "--tokens-per-s", "1000",
                                "--out", str(tmp_path / "dry"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("│ diff", "│ base"))]
    assert len(rows) == 2 and not (tmp_path / "dry").exists()
    prompt = int(rows[0].split("│")[4].strip().replace(",", ""))
    samples = int(rows[0].split("│")[2])
    budget = 16 + 12 * 4 if not source else 256
    assert prompt <= samples * (4096 - budget) and prompt > 0

"""Hallucination judges: a binary verdict on a model output given its source document and the reference.

- `openai:MODEL`: the OpenAI chat completions API, key from OPENAI_API_KEY.
- `openai-compatible:BASE_URL#MODEL`: any server speaking that API (e.g. vLLM); OPENAI_API_KEY is sent when set.
- `hf:PATH`: a local causal LM through diffeval's backend factory (`--judge-backend hf` or `vllm`); it compares the
  likelihood of " yes" and " no".
- `overlap`: an offline, deterministic proxy (share of output numbers, names and content words that the source
  lacks); always labelled a proxy, never a hallucination rate.

A judge that is a reasoning model reads its verdict after its thinking: a reply's text after its last end-of-thinking
marker (`parse_verdict`); with a judge thinking budget, a local judge thinks first (at most that many tokens, as
models.thinking does for the evaluated models) and its " yes"/" no" are compared after its thinking.

Every verdict is cached on disk keyed by (judge, prompt hash). The API key is read from the environment at request
time and never stored: not in the cache, the run folder, run.json or logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from diffeval import machine
from diffeval.config import is_count
from diffeval.errors import InputError
from diffeval.models.backend import Backend
from diffeval.models.thinking import KNOWN, MARGIN, SEPARATOR

JUDGE_PROMPT = """You check a model's {kind} against its source document for contextual hallucination.
The {kind} is hallucination-free when everything it states is supported by the document; it is not when any claim \
is missing from or contradicted by the document. The reference {kind} is given for guidance only.

Document:
{source}
{question}
Reference {kind}:
{reference}

Model {kind}:
{output}

Is the model {kind} hallucination-free? Reply with "Verdict: yes" or "Verdict: no" on the first line, then \
"Rationale:" and one sentence."""


class JudgeError(Exception):
    """The judge failed after its retries; finished samples are kept and a rerun resumes."""


@dataclass(frozen=True)
class Verdict:
    hallucination_free: bool | None  # None: the reply could not be parsed
    rationale: str


@dataclass(frozen=True)
class JudgeItem:
    kind: str  # "summary" or "answer"
    source: str
    question: str
    reference: str
    output: str

    def prompt(self) -> str:
        question = f"\nQuestion:\n{self.question}\n" if self.question else ""
        return JUDGE_PROMPT.format(
            kind=self.kind, source=self.source, question=question, reference=self.reference, output=self.output.strip()
        )


# a line that is exactly the verdict, punctuation and markup aside: "Verdict: yes", "**Verdict:** No."
_VERDICT_LINE = re.compile(r"^[\W_]*verdict[\W_]*(yes|no)[\W_]*$", re.IGNORECASE)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_RATIONALE = re.compile(r"rationale\W{0,3}\s*(.+)", re.IGNORECASE | re.DOTALL)


UNCLOSED_REPLY = "thinking unclosed"
MIN_JUDGE_PROMPT = 64  # positions a reasoning hf judge keeps for the document, output and question it judges


def after_thinking(reply: str) -> str | None:
    """A reply's text after its thinking: after the last end marker of a known pair (<think>…</think>); None where
    it opens a thinking it never closes; the reply itself where it has no markers."""
    for _, end in KNOWN:
        at = reply.rfind(end)
        if at >= 0:
            return reply[at + len(end) :]
    return None if any(start in reply for start, _ in KNOWN) else reply


def parse_verdict(reply: str, thinking: bool = False) -> Verdict:
    """The verdict from a line that is exactly `verdict: yes|no` (any case, punctuation around it), or from a JSON
    reply {"verdict": ...}; else unparsed (None). A reply that only mentions the format (it echoes the instruction
    `"Verdict: yes" or "Verdict: no"`), or gives both answers on verdict lines, is unparsed. With `thinking` (a judge
    given a thinking budget) the reply is read after its thinking (`after_thinking`), and one whose thinking never
    closed is unparsed; without it the reply is read whole, as before thinking budgets."""
    answer_text = after_thinking(reply) if thinking else reply
    if answer_text is None:
        return Verdict(None, UNCLOSED_REPLY)
    text = answer_text.strip()
    answers = {found.group(1).lower() for line in text.splitlines() if (found := _VERDICT_LINE.match(line.strip()))}
    answer = {"yes": True, "no": False}[answers.pop()] if len(answers) == 1 else None
    if not answers and answer is None:
        answer = _json_verdict(text)
    rationale = _RATIONALE.search(text)
    return Verdict(answer, (rationale.group(1) if rationale else text).strip()[:500])


def _json_verdict(text: str) -> bool | None:
    fenced = _FENCE.match(text)
    try:
        data = json.loads(fenced.group(1) if fenced else text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("verdict", data.get("hallucination_free"))
    return value if isinstance(value, bool) else {"yes": True, "no": False}.get(str(value).lower())


class VerdictCache:
    """sqlite file of verdicts keyed by (judge id, sha256 of the prompt)."""

    def __init__(self, folder: str | Path):
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(Path(folder) / "verdicts.sqlite", check_same_thread=False)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS verdicts (judge TEXT, prompt TEXT, verdict INTEGER, "
            "rationale TEXT, PRIMARY KEY (judge, prompt))"
        )
        self._lock = threading.Lock()

    @staticmethod
    def key(prompt: str) -> str:
        return hashlib.sha256(prompt.encode()).hexdigest()

    def get(self, judge: str, prompt: str) -> Verdict | None:
        with self._lock:
            row = self._db.execute(
                "SELECT verdict, rationale FROM verdicts WHERE judge = ? AND prompt = ?", (judge, self.key(prompt))
            ).fetchone()
        return None if row is None else Verdict(None if row[0] is None else bool(row[0]), row[1])

    def put(self, judge: str, prompt: str, verdict: Verdict) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?)",
                (judge, self.key(prompt), verdict.hallucination_free, verdict.rationale),
            )
            self._db.commit()


class Judge:
    """Base: cached judging of items; subclasses implement `_judge_one` (run `concurrency` at a time) or, to judge
    many items in one go, `_judge_many`. A judge holds no model until it judges; `close` frees what it holds."""

    id: str
    kind = "judge"  # "proxy" for the overlap judge
    concurrency = 1
    batch = 64  # items a run hands to `judge` at once (its records are written when the call returns)

    def __init__(self, cache: VerdictCache):
        self.cache = cache

    def judge(self, items: list[JudgeItem]) -> list[Verdict]:
        prompts = [item.prompt() for item in items]
        verdicts = [self.cache.get(self.id, prompt) for prompt in prompts]
        todo = [i for i, verdict in enumerate(verdicts) if verdict is None]
        fresh = dict(zip(todo, self._judge_many([items[i] for i in todo], [prompts[i] for i in todo]))) if todo else {}
        return [verdict if verdict is not None else fresh[i] for i, verdict in enumerate(verdicts)]

    def _judge_many(self, items: list[JudgeItem], prompts: list[str]) -> list[Verdict]:
        """Verdicts of uncached items, each cached as it comes (a judge failing later keeps the earlier ones); an
        unparsed verdict is never cached, so a rerun asks again."""

        def one(item: JudgeItem, prompt: str) -> Verdict:
            verdict = self._judge_one(item, prompt)
            if verdict.hallucination_free is not None:
                self.cache.put(self.id, prompt, verdict)
            return verdict

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, items, prompts))

    def _judge_one(self, item: JudgeItem, prompt: str) -> Verdict:
        raise NotImplementedError

    def close(self) -> None:
        """Free what judging loaded (a local model's engine)."""


REPLY_TOKENS = 200  # a chat judge's reply: the verdict line and one sentence


class ChatJudge(Judge):
    """Any chat completions server: retries with backoff on 429, 5xx and timeouts; a concurrency limit."""

    def __init__(
        self,
        cache,
        base_url: str,
        model: str,
        judge_id: str,
        require_key: bool,
        timeout: float = 60.0,
        retries: int = 5,
        concurrency: int = 4,
        backoff: float = 1.0,
        thinking_budget: int | None = None,
    ):
        super().__init__(cache)
        if require_key and not os.environ.get("OPENAI_API_KEY"):
            raise InputError(f"judge {judge_id} needs OPENAI_API_KEY in the environment")
        # a reasoning judge's reply holds its thinking too: its budget comes on top of the verdict's 200 tokens, and
        # names the judge (another budget, other verdicts); without one the id and cache keys are as before
        if thinking_budget is not None:
            judge_id = f"{judge_id}@thinking={thinking_budget}"
        self.max_tokens = REPLY_TOKENS + (thinking_budget or 0)
        self.thinking = thinking_budget is not None
        self.id, self.model, self.url = judge_id, model, base_url.rstrip("/") + "/chat/completions"
        self.timeout, self.retries, self.concurrency, self.backoff = timeout, retries, concurrency, backoff
        self.batch = concurrency  # a record per verdict as soon as the requests in flight return

    def _judge_one(self, item: JudgeItem, prompt: str) -> Verdict:
        return parse_verdict(self._complete(prompt), thinking=self.thinking)

    def _complete(self, prompt: str) -> str:
        import httpx  # here, not at the top: the CLI imports this module at start-up

        key = os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        problem, retry_after = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, retry_after))
            try:
                response = httpx.post(self.url, json=body, headers=headers, timeout=self.timeout)
            except httpx.TimeoutException:
                problem = "timeout"
                continue
            except httpx.TransportError as exc:
                problem = f"connection error ({type(exc).__name__})"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                problem = f"HTTP {response.status_code}"
                retry_after = response.headers.get("retry-after")
                continue
            if response.status_code >= 400:
                raise JudgeError(f"judge {self.id}: HTTP {response.status_code}: {response.text[:200]}")
            try:
                return response.json()["choices"][0]["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError):
                return response.text  # not the chat completions shape: parse what came back
        raise JudgeError(
            f"judge {self.id} failed after {self.retries + 1} attempts ({problem}); "
            "finished samples are saved, rerun to resume"
        )

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        """The server's Retry-After when it gives seconds (capped at 60), else exponential backoff."""
        if retry_after and is_count(retry_after):
            return min(float(retry_after), 60.0)
        return self.backoff * 2 ** (attempt - 1)


class HFJudge(Judge):
    """A local causal LM: the verdict is whichever of " yes" / " no" is likelier after the judge prompt.

    Constructing one checks the checkpoint and the engine only; the model loads when it first judges (a run judges
    after every evaluated model has generated and been freed), and `close` frees it.

    With a thinking budget the judge is a reasoning model: the prompt is the user turn of its chat template, it thinks
    first (at most `thinking_budget` tokens, stopped at its end marker), and " yes"/" no" are compared after its
    thinking and SEPARATOR + "Verdict:". A thinking that never closes gives no verdict (unparsed, never cached)."""

    def __init__(self, cache, path: str, device: str = "auto", backend: str = "hf", thinking_budget: int | None = None):
        from diffeval.models.backend import EngineSettings, check_backend
        from diffeval.models.checkpoints.check import check_checkpoint
        from diffeval.models.checkpoints.loading import describe, load_tokenizer
        from diffeval.models.spec import ModelSpec
        from diffeval.models.thinking import resolve_markers
        from diffeval.models.tokenizer import check_chat_template

        super().__init__(cache)
        needs = {"score"} | ({"generate", "thinking"} if thinking_budget is not None else set())
        check_backend("the hf: judge", frozenset(needs), backend)
        self.spec, self.engine, self.thinking_budget = ModelSpec("judge", path), backend, thinking_budget
        self.id = f"hf:{path}" + (f"@thinking={thinking_budget}" if thinking_budget is not None else "")
        # a judge's weights are checked like the evaluated models': transformers would randomise a missing tensor
        self.max_tokens = describe(self.spec, check_checkpoint(self.spec)).max_positions or 4096
        self.settings = EngineSettings(device=device, max_model_len=self.max_tokens)
        self.markers = None
        if thinking_budget is not None:  # refused in one line before any work: no template, or no markers
            tokenizer = load_tokenizer(self.spec)
            if not tokenizer.chat_template:
                raise InputError(f"judge {self.id} has no chat template in its tokenizer, where a reasoning model "
                                 "thinks: leave out --judge-thinking-budget")  # fmt: skip
            try:
                check_chat_template(tokenizer, f"judge hf:{path}")
                self.markers = resolve_markers(tokenizer, f"judge hf:{path}")
            except InputError as exc:  # the evaluated models' refusals, with the judge's own way out
                reason = str(exc).partition(": give ")[0].partition(": leave out ")[0]
                raise InputError(f"{reason}: leave out --judge-thinking-budget") from None
        self.backend: Backend | None = None  # loaded at the first verdict

    def _judge_many(self, items: list[JudgeItem], prompts: list[str]) -> list[Verdict]:
        """Every item in one `score_choices` call (no shared prefix): vLLM schedules them together."""
        from diffeval.models.backend import make_backend
        from diffeval.models.tokenizer import encode_choices_in_context

        if self.backend is None:
            self.backend = make_backend(self.spec, self.settings, self.engine)
        if self.thinking_budget is not None:
            return self._judge_after_thinking(prompts, self.thinking_budget)
        queries, choices = [], []
        for prompt in prompts:
            # the verdict words are tokenized after the prompt, as the judge reads them
            prefix, (query,), (words,) = encode_choices_in_context(
                self.backend, prompt + "\nVerdict:", [""], [" yes", " no"]
            )
            ids = prefix + query
            room = self.max_tokens - max(map(len, words)) - 2
            if len(ids) > room:  # keep the question and output, cut the document's middle
                ids = ids[: room // 2] + ids[-(room - room // 2) :]
            queries.append(ids)
            choices.append(words)
        verdicts = []
        for prompt, ((yes, _), (no, _)) in zip(prompts, self.backend.score_choices([], queries, choices)):
            verdicts.append(Verdict(yes > no, f"log P(yes) - log P(no) = {yes - no:.3f}"))
            self.cache.put(self.id, prompt, verdicts[-1])
        return verdicts

    def _judge_after_thinking(self, prompts: list[str], budget: int) -> list[Verdict]:
        """A reasoning judge: it thinks after its chat template's generation prompt (all prompts in one generate
        call), then " yes" and " no" are scored after its thinking and SEPARATOR + "Verdict:"."""
        from diffeval.models.thinking import closed_in
        from diffeval.models.tokenizer import encode_choices_in_context, find_ids

        backend, markers = self.backend, self.markers
        assert backend is not None and markers is not None
        prefix, (query,), (words,) = encode_choices_in_context(
            backend, SEPARATOR + "Verdict:", [""], [" yes", " no"], special_tokens=False
        )
        verdict_ids = prefix + query
        room = self.max_tokens - budget - len(verdict_ids) - max(map(len, words)) - MARGIN
        if room < MIN_JUDGE_PROMPT:
            raise InputError(
                f"judge {self.id}: --judge-thinking-budget {budget} leaves {max(room, 0)} of its {self.max_tokens} "
                f"positions for the prompt: use at most --judge-thinking-budget {budget - MIN_JUDGE_PROMPT + room}"
            )
        heads = []
        for prompt in prompts:
            ids = backend.encode(backend.render_prompt(prompt, "", True)).ids
            if len(ids) > room:  # keep the question and output, cut the document's middle
                ids = ids[: room // 2] + ids[-(room - room // 2) :]
            heads.append(ids)
        thinking = [i for i, head in enumerate(heads) if not closed_in(head, markers)]
        generated = backend.generate([heads[i] for i in thinking], budget, [], end=markers.end_ids) if thinking else []
        thoughts = dict(zip(thinking, (g.ids for g in generated)))
        queries = {}
        for i, head in enumerate(heads):
            ids = thoughts.get(i, [])
            if i not in thoughts or find_ids(ids, markers.end_ids) is not None:
                queries[i] = head + ids + verdict_ids
        order = sorted(queries)
        scored = dict(zip(order, self.backend_scores([queries[i] for i in order], words))) if order else {}
        verdicts = []
        for i, prompt in enumerate(prompts):
            if i not in scored:
                verdicts.append(Verdict(None, f"{UNCLOSED_REPLY} within the judge's budget of {budget} tokens"))
                continue
            yes, no = scored[i]
            verdicts.append(Verdict(yes > no, f"log P(yes) - log P(no) = {yes - no:.3f}, after thinking"))
            self.cache.put(self.id, prompt, verdicts[-1])
        return verdicts

    def backend_scores(self, queries: list[list[int]], words: list[list[int]]) -> list[tuple[float, float]]:
        """(log P(" yes"), log P(" no")) after each query, in one `score_choices` call."""
        assert self.backend is not None
        found = self.backend.score_choices([], queries, [words] * len(queries))
        return [(yes, no) for (yes, _), (no, _) in found]

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


_STOPWORDS = frozenset(
    "a an the and or but of to in on at by for with from as is are was were be been being it its this that these those "
    "he she they we you i his her their our your them him us not no yes has have had do does did will would can could "
    "should may might must said says also than then there here which who whom whose what when where why how all any "
    "some more most other into over after before about up down out so such very just".split()
)


def overlap_units(text: str) -> set[str]:
    """Checkable units of a text: numbers (#), capitalised names (@) and other content words (~)."""
    numbers = {n.replace(",", "") for n in re.findall(r"\d[\d,.]*\d|\d", text)}
    names = {w.lower() for w in re.findall(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]{2,}", text)}
    words = {w for w in re.findall(r"[a-z]{3,}", text.lower()) if w not in _STOPWORDS} - names
    return {f"#{n}" for n in numbers} | {f"@{n}" for n in names} | {f"~{w}" for w in words}


class OverlapJudge(Judge):
    """Offline proxy: an output passes when at most `threshold` of its checkable units are absent from the source."""

    kind = "proxy"

    def __init__(self, cache, threshold: float = 0.25):
        super().__init__(cache)
        self.id, self.threshold = f"overlap@{threshold}", threshold

    def unsupported_share(self, output: str, source: str) -> float:
        units = overlap_units(output)
        if not units:
            return 0.0
        source_numbers = {n.replace(",", "") for n in re.findall(r"\d[\d,.]*\d|\d", source)}
        source_words = set(re.findall(r"[a-z]+", source.lower()))
        source_pairs = {u for u in overlap_units(source) if u.startswith("~")}
        missing = [
            u
            for u in units
            if (u[0] == "#" and u[1:] not in source_numbers)
            or (u[0] == "@" and u[1:] not in source_words)
            or (u[0] == "~" and u not in source_pairs)
        ]
        return len(missing) / len(units)

    def _judge_one(self, item: JudgeItem, prompt: str) -> Verdict:
        share = self.unsupported_share(item.output, item.source)
        return Verdict(share <= self.threshold, f"proxy: {share:.3f} of output units unsupported by the source")


def make_judge(
    spec: str,
    cache_dir: str | None = None,
    *,
    timeout: float = 60.0,
    retries: int = 5,
    concurrency: int = 4,
    device: str = "auto",
    backend: str = "hf",
    thinking_budget: int | None = None,
) -> Judge:
    """The judge `spec` names. `thinking_budget`: the judge is a reasoning model that may think that many tokens before
    its verdict (not for the overlap proxy, which reads no reply)."""
    cache = VerdictCache(cache_dir or machine.cache_dir())
    kind, _, rest = spec.partition(":")
    if spec == "overlap":
        return OverlapJudge(cache)
    if kind == "openai" and rest:
        return ChatJudge(
            cache, "https://api.openai.com/v1", rest, spec, True, timeout, retries, concurrency,
            thinking_budget=thinking_budget,
        )  # fmt: skip
    if kind == "openai-compatible" and "#" in rest:
        base_url, _, model = rest.rpartition("#")
        if base_url.startswith(("http://", "https://")) and model:
            return ChatJudge(
                cache, base_url, model, spec, False, timeout, retries, concurrency, thinking_budget=thinking_budget
            )
    if kind == "hf" and rest:
        return HFJudge(cache, rest, device, backend, thinking_budget)
    raise InputError(f"bad --judge {spec!r}: use openai:MODEL, openai-compatible:BASE_URL#MODEL, hf:PATH or overlap")

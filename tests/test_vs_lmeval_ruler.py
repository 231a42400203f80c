"""benchmarks/vs_lmeval_ruler.py reads where lm-eval put each answer from its prompt: prompts built here in RULER's
layouts (its templates, a needle haystack, vt's one-shot example with chains of its own) with the answer at a known
line, and the depth it reads is that line's. Its example swaps exchange exactly the one-shot examples."""

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vs_lmeval_ruler import VT_HEAD, answer_depth, swap_examples  # noqa: E402

NIAH_HEAD = ("Some special magic uuids are hidden within the following text. Make sure to memorize it. I will quiz you "
             "about the uuids afterwards.\n")  # fmt: skip
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def needle(key: str, value: str) -> str:
    return f"One of the special magic uuids for {key} is: {value}."


@pytest.mark.parametrize("slot", [0, 3, 8])
def test_a_needle_haystacks_answer_depth_is_its_slot(slot):
    # RULER's needle haystack: lines of equal length, the answer inserted before distractor `slot` of 9
    lines = [needle(str(uuid.UUID(int=i)), str(uuid.UUID(int=100 + i))) for i in range(9)]
    key, value = str(uuid.UUID(int=7777)), str(uuid.UUID(int=8888))
    lines.insert(slot, needle(key, value))
    prompt = NIAH_HEAD + "\n".join(lines) + f"\nWhat are all the special magic uuids for {key} mentioned in the text?"
    assert answer_depth("niah_multikey_3", prompt, [value]) == round(100 * slot / 10)


def test_a_noise_haystacks_answer_depth_counts_characters_before_it():
    before, after = NOISE * 3, NOISE * 7
    value = "4917302"
    text = f"{before}\n{needle('quiet-lake', value)}\n{after}"
    prompt = NIAH_HEAD + text + "\nWhat is the special magic number for quiet-lake mentioned in the provided text?"
    assert answer_depth("niah_single_1", prompt, [value]) == round(100 * (len(before) + 1) / len(text))


def test_vt_reads_the_first_assignment_of_the_chain_after_the_one_shot_example():
    example = VT_HEAD + "VAR QPW = 12345 " + NOISE + " VAR ZTR = VAR QPW\nQuestion: Find all variables ... Answer: QPW"
    chain = ["VAR ABCDE = 54321", "VAR FGHIJ = VAR ABCDE", "VAR KLMNO = VAR FGHIJ"]
    sentences = [NOISE] * 10
    for offset, (position, line) in enumerate(zip([4, 6, 9], chain)):
        sentences.insert(position + offset, line)
    context = " ".join(sentences)
    prompt = example + "\n\n" + VT_HEAD + context + "\nQuestion: Find all variables that are assigned the value 54321"
    expected = round(100 * context.index("VAR ABCDE =") / len(context))
    assert answer_depth("ruler_vt", prompt, ["ABCDE", "FGHIJ", "KLMNO"]) == expected


def test_cwe_has_no_depth():
    assert answer_depth("ruler_cwe", "1. apple 2. pear", ["apple"]) is None
    assert answer_depth("ruler_cwe_with_example", "1. apple 2. pear", ["apple"]) is None


def test_swapping_examples_exchanges_what_precedes_the_last_instruction_and_keeps_each_prompts_answer():
    def prompt(example_names: str, value: str) -> str:
        example = f"{VT_HEAD}VAR {example_names} = 1 {NOISE}\nQuestion: ... Answer: ... they are: {example_names}\n\n"
        return example + f"{VT_HEAD}VAR ABCDE = {value} {NOISE}\nQuestion: ... value {value}."

    ours = [(prompt("QPW", "111") + " Answer: ours", " Answer: ours", ["ABCDE"])]
    theirs = [(prompt("ZTR ZTR", "222") + " Answer: theirs", "Answer: theirs", ["FGHIJ"])]
    ((ours_with_theirs, our_prefix, our_expected),), ((theirs_with_ours, their_prefix, their_expected),) = (
        swap_examples(VT_HEAD, ours, theirs)
    )
    assert ours_with_theirs.startswith(f"{VT_HEAD}VAR ZTR ZTR = 1") and "value 111. Answer: ours" in ours_with_theirs
    assert theirs_with_ours.startswith(f"{VT_HEAD}VAR QPW = 1") and "value 222. Answer: theirs" in theirs_with_ours
    assert ours_with_theirs.count(VT_HEAD) == theirs_with_ours.count(VT_HEAD) == 2
    assert (our_prefix, our_expected, their_prefix, their_expected) == (" Answer: ours", ["ABCDE"], "Answer: theirs",
                                                                        ["FGHIJ"])  # fmt: skip

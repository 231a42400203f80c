"""Every `run` task command fed damage, one table per command: a count out of range (alone and inside a list of good
values), 0 and negative, more than the pool it draws from, digits `int` rejects, an option beside a source or probe
it does not act on, data files that are not UTF-8, empty, of the wrong shape, or that name a document twice or one
that is missing. Each row is refused in one line that names the option, before any run folder is written, and the
data it read stays byte-identical (`assert_refused_in_place`).

A row is (arguments, setup, message): `setup(tmp_path)` writes the damaged data in the real schema and returns the
paths the arguments name as `{placeholders}`; None for a row that needs no data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bad_input import assert_refused_in_place

PAIR = ["-m", "diff=toy-diff", "-m", "base=toy-base"]
PROSE = "The quiet river ran past the old mill, and the miller counted his sacks of grain by the door. "
NOT_UTF8 = b"a haystack line \xff\xfe that is not UTF-8.\n"


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ---- nll: a books folder (books.jsonl + <id>.txt, diffeval/data/books.py)


def books(index: list | bytes, texts: dict[str, str | bytes]):
    def setup(tmp: Path) -> dict[str, Path]:
        lines = (
            index
            if isinstance(index, bytes)
            else "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in index)
        )
        _write(tmp / "books" / "books.jsonl", lines)
        for book, text in texts.items():
            _write(tmp / "books" / f"{book}.txt", text)
        return {"books": tmp / "books"}

    return setup


TWO_BOOKS = books([{"id": "b1", "title": "One"}, {"id": "b2", "title": "Two"}], {"b1": PROSE * 60, "b2": PROSE * 60})
NLL_RUN = ["run", "nll", *PAIR, "--ctx", "1k"]
NLL = {
    "windows_beyond_the_document": ([*NLL_RUN, "--data-dir", "{books}", "--windows", "500"], TWO_BOOKS,
                                    "--windows 500: document b1 holds"),
    "docs_beyond_the_folder": ([*NLL_RUN, "--data-dir", "{books}", "--docs", "3"], TWO_BOOKS,
                               "--docs 3: --data books holds 2 document(s): give at most 2"),
    "docs_zero": ([*NLL_RUN, "--docs", "0"], None, "--docs 0: give at least 1"),
    "docs_negative": ([*NLL_RUN, "--docs", "-2"], None, "--docs -2: give at least 1"),
    "docs_superscript": ([*NLL_RUN, "--docs", "²"], None, "'--docs'"),
    "windows_zero": ([*NLL_RUN, "--windows", "0"], None, "--windows 0: give at least 1"),
    "buckets_beyond_half_ctx": ([*NLL_RUN, "--buckets", "5000"], None, "--buckets 5000: give 1 to 512"),
    "two_lengths": ([*NLL_RUN, "--ctx", "1k,2k"], None, "give one length"),
    "trained_at_arabic_digits": ([*NLL_RUN, "--trained-at", "٨k"], None, "bad context length"),
    "data_dir_beside_hf_data": ([*NLL_RUN, "--data", "hf:some/set", "--data-dir", "{books}"], TWO_BOOKS,
                                "--data-dir"),
    "unknown_data": ([*NLL_RUN, "--data", "novels"], None, "bad --data 'novels'"),
    "a_book_named_twice": ([*NLL_RUN, "--data-dir", "{books}"],
                           books([{"id": "b1"}, {"id": "b1"}], {"b1": PROSE * 60}), "names b1 a second time"),
    "a_book_missing": ([*NLL_RUN, "--data-dir", "{books}"], books([{"id": "b1"}, {"id": "b3"}], {"b1": PROSE * 60}),
                       "names b3, but b3.txt is not in"),
    "book_not_utf8": ([*NLL_RUN, "--data-dir", "{books}"], books([{"id": "b1"}], {"b1": NOT_UTF8}),
                      "b1.txt is not UTF-8 text"),
    "index_not_utf8": ([*NLL_RUN, "--data-dir", "{books}"], books(b'{"id": "b\xff"}\n', {}),
                       "books.jsonl is not UTF-8 text"),
    "index_line_not_an_object": ([*NLL_RUN, "--data-dir", "{books}"], books(["[1, 2]"], {}), "not a book entry"),
    "index_empty": ([*NLL_RUN, "--data-dir", "{books}"], books([], {}), "lists no books"),
    "first_chapter_negative": ([*NLL_RUN, "--data-dir", "{books}"],
                               books([{"id": "b1", "first_chapter_char": -50}], {"b1": PROSE * 60}),
                               "first_chapter_char -50 is not a character offset"),
    "first_chapter_past_the_end": ([*NLL_RUN, "--data-dir", "{books}"],
                                   books([{"id": "b1", "first_chapter_char": 10**7}], {"b1": PROSE * 60}),
                                   "is past the end of b1.txt"),
    "book_empty": ([*NLL_RUN, "--data-dir", "{books}"], books([{"id": "b1", "first_chapter_char": 0}], {"b1": ""}),
                   "b1.txt is empty: give the book's text, or leave it out"),
    "first_chapter_not_a_number": ([*NLL_RUN, "--data-dir", "{books}"],
                                   books([{"id": "b1", "first_chapter_char": "ten"}], {"b1": PROSE * 60}),
                                   "first_chapter_char 'ten' is not a character offset"),
}  # fmt: skip


# ---- the haystack tasks: an essays haystack (a folder of .txt files or a JSON list of texts, data/haystack.py)


def essays(files: dict[str, str | bytes]):
    def setup(tmp: Path) -> dict[str, Path]:
        for name, content in files.items():
            _write(tmp / "essays" / name, content)
        return {"essays": tmp / "essays"}

    return setup


ESSAY_NOT_UTF8 = essays({"a.txt": PROSE * 20, "b.txt": NOT_UTF8})
ESSAY_WRONG_SHAPE = essays({"set.json": json.dumps({"texts": [PROSE]})})
ESSAY_EMPTY_JSON = essays({"set.json": ""})
NEEDLE_RUN = ["run", "needle", *PAIR, "--ctx", "1k", "--samples", "1"]
NEEDLE = {
    "needles_out_of_range_in_a_list": ([*NEEDLE_RUN, "--needles", "1,2,100", "--queries", "1"], None,
                                       "needles N=100: at most 64"),
    "needles_zero": ([*NEEDLE_RUN, "--needles", "0"], None, "need 1 <= R <= N"),
    "queries_beyond_needles": ([*NEEDLE_RUN, "--needles", "2", "--queries", "3"], None, "need 1 <= R <= N"),
    "a_setting_twice": ([*NEEDLE_RUN, "--needles", "2,2", "--queries", "1,1"], None, "N=2, R=1 twice"),
    "depth_out_of_range_in_a_list": ([*NEEDLE_RUN, "--depths", "0,50,101"], None, "depth 101 is outside 0-100"),
    "depth_negative": ([*NEEDLE_RUN, "--depths", "-5"], None, "depth -5 is outside 0-100"),
    "depths_arabic_digits": ([*NEEDLE_RUN, "--depths", "0,٥٠"], None, "bad --depths"),
    "samples_zero": ([*NEEDLE_RUN, "--samples", "0"], None, "--samples 0"),
    "ctx_arabic_digits": ([*NEEDLE_RUN, "--ctx", "١k"], None, "bad context length"),
    "essay_not_utf8": ([*NEEDLE_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "b.txt is not UTF-8 text"),
    "essays_json_wrong_shape": ([*NEEDLE_RUN, "--haystack", "essays:{essays}/set.json"], ESSAY_WRONG_SHAPE,
                                "must be a JSON list of texts"),
    "essays_json_empty": ([*NEEDLE_RUN, "--haystack", "essays:{essays}/set.json"], ESSAY_EMPTY_JSON,
                          "cannot read haystack"),
}  # fmt: skip

ATTENTION_RUN = ["run", "attention", *PAIR, "--ctx", "1k", "--samples", "1"]
ATTENTION = {
    "rows_unknown": ([*ATTENTION_RUN, "--rows", "all"], None, "bad --rows 'all'"),
    "span_unknown": ([*ATTENTION_RUN, "--span", "city"], None, "bad --span 'city'"),
    "needles_out_of_range_in_a_list": ([*ATTENTION_RUN, "--needles", "1,65", "--queries", "1"], None,
                                       "needles N=65: at most 64"),
    "depth_out_of_range_in_a_list": ([*ATTENTION_RUN, "--depths", "0,200"], None, "depth 200 is outside 0-100"),
    "samples_negative": ([*ATTENTION_RUN, "--samples", "-1"], None, "--samples -1"),
    "essay_not_utf8": ([*ATTENTION_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "is not UTF-8 text"),
}  # fmt: skip

MK_NIAH_RUN = ["run", "mk-niah", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "50"]
MK_NIAH = {
    "variant_out_of_range_in_a_list": ([*MK_NIAH_RUN, "--variants", "1,4"], None, "--variants [1, 4]"),
    "keys_zero": ([*MK_NIAH_RUN, "--keys", "0"], None, "--keys 0: give 1 to 64"),
    "keys_beyond_the_reserved_pairs": ([*MK_NIAH_RUN, "--keys", "65"], None, "--keys 65: give 1 to 64"),
    "keys_beyond_what_1k_holds": ([*MK_NIAH_RUN, "--variants", "1", "--keys", "64"], None,
                                  "holds at most 31 keys (--keys 31)"),
    "keys_arabic_digits": ([*MK_NIAH_RUN, "--keys", "١"], None, "'--keys'"),
    "keys_without_variant_1": ([*MK_NIAH_RUN, "--variants", "2,3", "--keys", "4"], None,
                               "--keys 4 applies only with variant 1 in --variants"),
    "haystack_without_variant_1": ([*MK_NIAH_RUN, "--variants", "3", "--haystack", "noise"], None,
                                   "--haystack noise applies only with variant 1"),
    "depth_out_of_range_in_a_list": ([*MK_NIAH_RUN, "--depths", "0,100,150"], None, "depth 150"),
    "essay_not_utf8": ([*MK_NIAH_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "is not UTF-8 text"),
}  # fmt: skip

MV_NIAH_RUN = ["run", "mv-niah", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "50"]
MV_NIAH = {
    "values_zero": ([*MV_NIAH_RUN, "--values", "0"], None, "--values 0: give 1 to 64"),
    "values_beyond_the_reserved_pairs": ([*MV_NIAH_RUN, "--values", "100"], None, "--values 100: give 1 to 64"),
    "values_beyond_what_1k_holds": ([*MV_NIAH_RUN, "--values", "64"], None, "values (--values "),
    "values_superscript": ([*MV_NIAH_RUN, "--values", "²"], None, "'--values'"),
    "depth_out_of_range_in_a_list": ([*MV_NIAH_RUN, "--depths", "50,-1"], None, "depth -1"),
    "base_length_not_run": ([*MV_NIAH_RUN, "--base-lengths", "2k"], None, "--base-lengths 2K"),
    "essays_json_wrong_shape": ([*MV_NIAH_RUN, "--haystack", "essays:{essays}/set.json"], ESSAY_WRONG_SHAPE,
                                "must be a JSON list of texts"),
}  # fmt: skip

VT_RUN = ["run", "vt", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "50"]
VT = {
    "hops_beyond_the_example_noise": ([*VT_RUN, "--hops", "200"], None, "holds at most one chain of"),
    "hops_beyond_the_example_names": ([*VT_RUN, "--hops", "20000"], None, "give at most 17,575 hops"),
    "hops_zero": ([*VT_RUN, "--hops", "0"], None, "--hops 0: a chain needs at least 1 hop"),
    "chains_zero": ([*VT_RUN, "--chains", "0"], None, "--chains 0: give at least 1"),
    "chains_beyond_the_values": ([*VT_RUN, "--chains", "100000"], None, "--chains 100000: there are 90,000"),
    "chains_beyond_what_1k_holds": ([*VT_RUN, "--chains", "3000"], None, "chains of 4 hops (--chains "),
    "hops_arabic_digits": ([*VT_RUN, "--hops", "٤"], None, "'--hops'"),
    "depth_out_of_range_in_a_list": ([*VT_RUN, "--depths", "25,125"], None, "depth 125"),
    "essay_not_utf8": ([*VT_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "is not UTF-8 text"),
}  # fmt: skip

CWE_RUN = ["run", "cwe", "--ctx", "1k", "--samples", "1"]
CWE = {
    "common_zero": ([*CWE_RUN, *PAIR, "--common", "0"], None, "--common 0: the word pool holds"),
    "common_beyond_the_word_pool": ([*CWE_RUN, *PAIR, "--common", "9999"], None, "give 1 to 3,675 common words"),
    "common_beyond_what_1k_holds": ([*CWE_RUN, "-m", "m={tiny}", "--common", "200"], None,
                                    "common words at frequency 6 (--common "),
    "frequencies_arabic_digits": ([*CWE_RUN, *PAIR, "--frequencies", "30,٣"], None, "--frequencies '30,٣'"),
    "frequencies_common_not_above_rare": ([*CWE_RUN, *PAIR, "--frequencies", "3,30"], None, "C > R >= 1"),
    "frequencies_rare_zero": ([*CWE_RUN, *PAIR, "--frequencies", "3,0"], None, "C > R >= 1"),
    "samples_zero": ([*CWE_RUN, *PAIR, "--samples", "0"], None, "--samples 0"),
}  # fmt: skip


def needle_set(data: dict | bytes | str):
    def setup(tmp: Path) -> dict[str, Path]:
        content = data if isinstance(data, (bytes, str)) else json.dumps(data)
        return {"set": _write(tmp / "needles" / "set.json", content)}

    return setup


PAIR_ENTRY = {"id": "p1", "question": "Which character has been to Dresden?", "keywords": ["Dresden"],
              "direct": "Actually, {character} lives next to the Semper Opera House.",
              "inverted": "The Semper Opera House is next to where {character} lives."}  # fmt: skip
NOLIMA_RUN = ["run", "nolima", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "50"]
NOLIMA = {
    "template_unknown_in_a_list": ([*NOLIMA_RUN, "--templates", "direct,reversed"], None,
                                   "--templates direct,reversed"),
    "depth_out_of_range_in_a_list": ([*NOLIMA_RUN, "--depths", "0,101"], None, "depth 101"),
    "needle_set_not_utf8": ([*NOLIMA_RUN, "--needle-set", "{set}"], needle_set(b'{"name": "\xff"}'),
                            "cannot read needle set"),
    "needle_set_empty": ([*NOLIMA_RUN, "--needle-set", "{set}"], needle_set(""), "cannot read needle set"),
    "needle_set_a_list": ([*NOLIMA_RUN, "--needle-set", "{set}"], needle_set("[1, 2]"), "it is no JSON object"),
    "characters_not_a_list": ([*NOLIMA_RUN, "--needle-set", "{set}"],
                              needle_set({"characters": "Yuki", "pairs": [PAIR_ENTRY]}), '"characters" must be'),
    "a_character_twice": ([*NOLIMA_RUN, "--needle-set", "{set}"],
                          needle_set({"characters": ["Yuki", "Yuki"], "pairs": [PAIR_ENTRY]}), "names 'Yuki' twice"),
    "pairs_empty": ([*NOLIMA_RUN, "--needle-set", "{set}"], needle_set({"characters": ["Yuki"], "pairs": []}),
                    '"pairs" must be a non-empty list'),
    "a_needle_without_its_character": ([*NOLIMA_RUN, "--needle-set", "{set}"],
                                       needle_set({"characters": ["Yuki"],
                                                   "pairs": [{**PAIR_ENTRY, "direct": "Someone lives there."}]}),
                                       "must hold {character} once"),
    "a_pair_id_twice": ([*NOLIMA_RUN, "--needle-set", "{set}"],
                        needle_set({"characters": ["Yuki"], "pairs": [PAIR_ENTRY, PAIR_ENTRY]}),
                        "pair id 'p1' repeats"),
    "keywords_not_a_list": ([*NOLIMA_RUN, "--needle-set", "{set}"],
                            needle_set({"characters": ["Yuki"], "pairs": [{**PAIR_ENTRY, "keywords": "Dresden"}]}),
                            '"keywords" must be a list'),
    "essay_not_utf8": ([*NOLIMA_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "is not UTF-8 text"),
}  # fmt: skip

DA_RUN = ["run", "distractor-attention", *PAIR, "--ctx", "1k", "--samples", "1", "--depths", "50"]
DA_MRCR = ["run", "distractor-attention", *PAIR, "--ctx", "1k", "--samples", "1", "--probe", "mrcr"]
DISTRACTOR_ATTENTION = {
    "keys_beside_vt": ([*DA_RUN, "--probe", "vt", "--keys", "3"], None, "--keys 3 applies only with --probe mk-niah"),
    "variants_beside_vt": ([*DA_RUN, "--probe", "vt", "--variants", "1"], None,
                           "--variants 1 applies only with --probe mk-niah"),
    "haystack_beside_vt": ([*DA_RUN, "--probe", "vt", "--haystack", "noise"], None,
                           "--haystack noise applies only with --probe mk-niah"),
    "chains_beside_mk_niah": ([*DA_RUN, "--probe", "mk-niah", "--chains", "3"], None,
                              "--chains 3 applies only with --probe vt"),
    "hops_beside_mk_niah": ([*DA_RUN, "--hops", "2"], None, "--hops 2 applies only with --probe vt"),
    "keys_without_variant_1": ([*DA_RUN, "--variants", "2", "--keys", "5"], None,
                               "--keys 5 applies only with --probe mk-niah and its variant 1"),
    "vt_without_a_distractor_chain": ([*DA_RUN, "--probe", "vt", "--chains", "1"], None,
                                      "--chains 1 leaves vt no distractor chain"),
    "mk_niah_without_a_distractor_needle": ([*DA_RUN, "--variants", "1", "--keys", "1"], None,
                                            "--keys 1 leaves mk-niah variant 1 no distractor needle"),
    "probe_unknown": ([*DA_RUN, "--probe", "needle"], None, "bad --probe 'needle'"),
    "chains_beyond_the_values": ([*DA_RUN, "--probe", "vt", "--chains", "100000"], None, "give at most 90,000"),
    "hops_beyond_what_1k_holds": ([*DA_RUN, "--probe", "vt", "--hops", "200"], None, "holds at most"),
    "variant_out_of_range_in_a_list": ([*DA_RUN, "--variants", "2,9"], None, "--variants [2, 9]"),
    "needles_beside_mk_niah": ([*DA_RUN, "--needles", "2"], None, "--needles 2 applies only with --probe mrcr"),
    "depths_beside_mrcr": ([*DA_MRCR, "--rendering", "plain", "--depths", "50"], None,
                           "--depths 50 applies only with --probe mk-niah or vt"),
    "mrcr_without_a_chat_template": ([*DA_MRCR, "--ctx", "2k"], None,
                                     "has no chat template in its tokenizer: pass --rendering plain"),
    "mrcr_needles_beyond_the_length": ([*DA_MRCR, "--rendering", "plain", "--needles", "8"], None,
                                       "--needles 8 do not fit --ctx 1024"),
}  # fmt: skip


# ---- icl: a data folder in the ../shared/datasets layout (trec/train.jsonl, trec/test.jsonl, data/icl.py)

TREC_ROW = {"text": "How far is it to the moon?", "coarse_label_id": 5, "fine_label_id": 40}


def trec(train: list | bytes | None = None, test: list | bytes | None = None, indices: str | bytes | None = None):
    def setup(tmp: Path) -> dict[str, Path]:
        for split, rows, count in (("train", train, 8), ("test", test, 5)):
            rows = rows if rows is not None else [{**TREC_ROW, "text": f"Question {i} about the moon?"}
                                                  for i in range(count)]  # fmt: skip
            lines = rows if isinstance(rows, bytes) else "".join(json.dumps(r) + "\n" for r in rows)
            _write(tmp / "icl" / "trec" / f"{split}.jsonl", lines)
        paths = {"icl": tmp / "icl"}
        if indices is not None:
            paths["indices"] = _write(tmp / "indices" / "trec.json", indices)
        return paths

    return setup


ICL_RUN = ["run", "icl", *PAIR, "--ctx", "1k", "--dataset", "trec", "--shots", "2", "--test-size", "3",
           "--data-dir", "{icl}"]  # fmt: skip
ICL = {
    "test_size_beyond_the_test_split": ([*ICL_RUN, "--test-size", "6"], trec(),
                                        "--test-size 6: trec holds 5 test rows: give --test-size 5 or fewer"),
    "shots_beyond_the_train_split_in_a_list": ([*ICL_RUN, "--shots", "2,9"], trec(),
                                               "--shots 9: trec holds 8 training examples: give at most 8"),
    "shots_arabic_digits": ([*ICL_RUN, "--shots", "2,٣"], trec(), "bad --shots value '٣'"),
    "shots_negative": ([*ICL_RUN, "--shots", "-1"], trec(), "bad --shots value '-1'"),
    "orders_zero_variants": ([*ICL_RUN, "--orders", "random:0"], trec(), "bad order 'random:0'"),
    "test_size_zero": ([*ICL_RUN, "--test-size", "0"], trec(), "--test-size and --draws must be at least 1"),
    "draws_zero": ([*ICL_RUN, "--draws", "0"], trec(), "--test-size and --draws must be at least 1"),
    "two_lengths": ([*ICL_RUN, "--ctx", "1k,2k"], trec(), "ICL takes one context length"),
    "dataset_unknown_in_a_list": ([*ICL_RUN, "--dataset", "trec,mnist"], trec(), "unknown dataset(s) ['mnist']"),
    "dataset_empty_item": ([*ICL_RUN, "--dataset", "trec,"], trec(), "bad --dataset 'trec,': an item is empty"),
    "dataset_twice": ([*ICL_RUN, "--dataset", "trec,trec"], trec(), "--dataset names 'trec' twice"),
    "dataset_none": ([*ICL_RUN, "--dataset", ""], trec(), "--dataset is empty: name one or more of trec,"),
    "orders_twice": ([*ICL_RUN, "--orders", "random:2,random:2"], trec(), "--orders names 'random:2' twice"),
    "test_index_twice": ([*ICL_RUN, "--test-indices", "{indices}"], trec(indices="[1, 1, 2]"),
                         "row 1 is listed twice"),
    "test_index_beyond_the_split": ([*ICL_RUN, "--test-indices", "{indices}"], trec(indices="[1, 2, 9]"),
                                    "indices outside the 5 test rows"),
    "test_indices_fewer_than_test_size": ([*ICL_RUN, "--test-indices", "{indices}"], trec(indices="[1, 2]"),
                                          "lists 2 test rows: give --test-size 2 or fewer"),
    "test_indices_not_utf8": ([*ICL_RUN, "--test-indices", "{indices}"], trec(indices=b"[1, \xff]"),
                              "cannot read a JSON list of ints"),
    "test_indices_booleans": ([*ICL_RUN, "--test-indices", "{indices}"], trec(indices="[true, false, 2]"),
                              "expected a JSON list of ints"),
    "train_not_utf8": (ICL_RUN, trec(train=b'{"text": "\xff"}\n'), "train.jsonl is not UTF-8 text"),
    "train_row_a_list": (ICL_RUN, trec(train=[[1, 2]] * 8), "trec files do not have the expected schema"),
    "train_label_beyond_the_labels": (ICL_RUN, trec(train=[{**TREC_ROW, "coarse_label_id": 99}] * 8),
                                      "coarse_label_id 99 is not a label id from 0 to 5"),
    "test_text_not_a_string": (ICL_RUN, trec(test=[{**TREC_ROW, "text": 7}] * 5), "text is not a non-empty string"),
    "test_split_empty": (ICL_RUN, trec(test=[]), "trec has no test rows"),
}  # fmt: skip


# ---- hallucination: a data folder of <name>.jsonl (xsum: document, summary, id; data/hallucination.py)

XSUM_ROW = {"document": "The council opened a new bridge over the river on Monday.", "summary": "A bridge opened."}


def xsum(rows: list | bytes):
    def setup(tmp: Path) -> dict[str, Path]:
        lines = rows if isinstance(rows, bytes) else "".join(json.dumps(r) + "\n" for r in rows)
        _write(tmp / "hallucination" / "xsum.jsonl", lines)
        return {"data": tmp / "hallucination"}

    return setup


THREE_DOCUMENTS = xsum([{**XSUM_ROW, "id": str(i)} for i in range(3)])
HALLUCINATION_RUN = ["run", "hallucination", *PAIR, "--ctx", "1k", "--dataset", "xsum", "--samples", "2",
                     "--judge", "overlap", "--data-dir", "{data}"]  # fmt: skip
HALLUCINATION = {
    "samples_beyond_the_dataset": ([*HALLUCINATION_RUN, "--samples", "5"], THREE_DOCUMENTS,
                                   "--samples 5: xsum holds 3 documents: give --samples 3 or fewer"),
    "samples_zero": ([*HALLUCINATION_RUN, "--samples", "0"], THREE_DOCUMENTS, "--samples and --judge-concurrency"),
    "a_document_id_twice": (HALLUCINATION_RUN, xsum([{**XSUM_ROW, "id": "7"}] * 3), "document id '7' repeats"),
    "rows_not_utf8": (HALLUCINATION_RUN, xsum(b'{"id": "\xff"}\n'), "xsum.jsonl is not UTF-8 text"),
    "row_a_list": (HALLUCINATION_RUN, xsum([[1, 2]] * 3), "rows do not have the expected schema"),
    "document_not_a_string": (HALLUCINATION_RUN, xsum([{**XSUM_ROW, "id": str(i), "document": 5} for i in range(3)]),
                              "document is a int, not a string"),
    "dataset_unknown_in_a_list": ([*HALLUCINATION_RUN, "--dataset", "xsum,squad"], THREE_DOCUMENTS,
                                  "unknown dataset(s) ['squad']"),
    "judge_backend_beside_an_offline_judge": ([*HALLUCINATION_RUN, "--judge-backend", "vllm"], THREE_DOCUMENTS,
                                              "--judge-backend vllm runs hf:PATH judges, and no --judge is one"),
    "judge_timeout_beside_an_offline_judge": ([*HALLUCINATION_RUN, "--judge-timeout", "5"], THREE_DOCUMENTS,
                                              "--judge-timeout 5.0 applies only with an openai:"),
    "judge_retries_beside_an_offline_judge": ([*HALLUCINATION_RUN, "--judge-retries", "2"], THREE_DOCUMENTS,
                                              "--judge-retries 2 applies only with an openai:"),
    "judge_concurrency_beside_an_offline_judge": ([*HALLUCINATION_RUN, "--judge-concurrency", "8"], THREE_DOCUMENTS,
                                                  "--judge-concurrency 8 applies only"),
}  # fmt: skip

# ---- longbench2: a LongBench v2 file (a JSON list, JSONL or parquet in its schema; data/longbench2.py)

LB2_ROW = {"_id": "q0", "domain": "Single-Document QA", "sub_domain": "Legal", "difficulty": "easy", "length": "short",
           "question": "Which clause?", "choice_A": "1", "choice_B": "2", "choice_C": "3", "choice_D": "4",
           "answer": "B", "context": PROSE}  # fmt: skip


def longbench2_file(rows: list | bytes, name: str = "data.json"):
    def setup(tmp: Path) -> dict[str, Path]:
        return {"data": _write(tmp / "longbench2" / name, rows if isinstance(rows, bytes) else json.dumps(rows))}

    return setup


TWO_QUESTIONS = longbench2_file([LB2_ROW, {**LB2_ROW, "_id": "q1"}])
LONGBENCH2_RUN = ["run", "longbench2", *PAIR, "--ctx", "1k", "--data-dir", "{data}"]
LONGBENCH2 = {
    "samples_zero": ([*LONGBENCH2_RUN, "--samples", "0"], TWO_QUESTIONS, "--samples 0: give at least 1"),
    "an_id_twice": (LONGBENCH2_RUN, longbench2_file([LB2_ROW, LB2_ROW]), "_id 'q0' repeats"),
    "file_not_utf8": (LONGBENCH2_RUN, longbench2_file(b'[{"_id": "\xff"}]'), "is not UTF-8 text"),
    "no_questions": (LONGBENCH2_RUN, longbench2_file([]), "holds no questions"),
    "a_row_a_list": (LONGBENCH2_RUN, longbench2_file([[1, 2]]), "row 1 is not an object"),
    "a_choice_not_a_string": (LONGBENCH2_RUN, longbench2_file([{**LB2_ROW, "choice_C": 3}]), "choice_C is not text"),
    "an_answer_not_a_letter": (LONGBENCH2_RUN, longbench2_file([{**LB2_ROW, "answer": "E"}]),
                               "answer 'E' is not one of A, B, C, D"),
    "jsonl_with_a_broken_line": (LONGBENCH2_RUN, longbench2_file(b'{"_id": "q0"}\n{"_id"\n', "rows.jsonl"),
                                 "is not valid JSON lines (line 1"),
    "parquet_not_parquet": (LONGBENCH2_RUN, longbench2_file(b"not parquet", "rows.parquet"),
                            "is not a readable parquet file"),
    "difficulty_unknown_in_a_list": ([*LONGBENCH2_RUN, "--difficulty", "easy,medium"], TWO_QUESTIONS,
                                     "unknown --difficulty 'medium'"),
    "lm_eval_prompt_beside_generation": ([*LONGBENCH2_RUN, "--prompt", "lm-eval"], TWO_QUESTIONS,
                                         "--prompt lm-eval is lm-eval's log-likelihood prompt: add --mode choices"),
}  # fmt: skip

# ---- graphwalks: generated graphs' options, and a folder of graphwalks*.jsonl rows (data/graphwalks.py)


def graphwalks_rows(rows: list | bytes):
    def setup(tmp: Path) -> dict[str, Path]:
        lines = rows if isinstance(rows, bytes) else "".join(json.dumps(r) + "\n" for r in rows)
        _write(tmp / "graphwalks" / "graphwalks.jsonl", lines)
        return {"data": tmp / "graphwalks"}

    return setup


GRAPHWALKS_ROW = {"prompt": "Operation:\nFind the parents of node ab.\n", "answer_nodes": ["cd"],
                  "problem_type": "parents"}  # fmt: skip
GRAPHWALKS_RUN = ["run", "graphwalks", *PAIR, "--ctx", "1k"]
GRAPHWALKS_ROWS = [*GRAPHWALKS_RUN, "--source", "openai", "--data-dir", "{data}"]
GRAPHWALKS = {
    "samples_zero": ([*GRAPHWALKS_RUN, "--samples", "0"], None, "--samples 0: need at least 1"),
    "samples_superscript": ([*GRAPHWALKS_RUN, "--samples", "²"], None, "'--samples'"),
    "nodes_one": ([*GRAPHWALKS_RUN, "--nodes", "1"], None, "--nodes 1 --degree 2: need at least 2 nodes"),
    "degree_zero": ([*GRAPHWALKS_RUN, "--degree", "0"], None, "need at least 2 nodes and 1 out-edge each"),
    "a_negative_depth_in_a_list": ([*GRAPHWALKS_RUN, "--depths", "1,-2"], None, "--depths 1,-2: give BFS depths"),
    "an_operation_left_empty": ([*GRAPHWALKS_RUN, "--operations", "bfs,"], None, "an item is empty"),
    "a_depth_beside_published_rows": ([*GRAPHWALKS_ROWS, "--depths", "3"], graphwalks_rows([GRAPHWALKS_ROW]),
                                      "--depths 3 applies only with --source generated"),
    "rows_not_utf8": (GRAPHWALKS_ROWS, graphwalks_rows(b'{"prompt": "\xff"}\n'), "graphwalks.jsonl is not UTF-8 text"),
    "rows_empty": (GRAPHWALKS_ROWS, graphwalks_rows([]), "its graphwalks files hold no rows"),
    "row_a_list": (GRAPHWALKS_ROWS, graphwalks_rows([[1, 2]]), "row 0 lacks prompt, answer_nodes or problem_type"),
    "answer_nodes_a_string": (GRAPHWALKS_ROWS, graphwalks_rows([{**GRAPHWALKS_ROW, "answer_nodes": "cd"}]),
                              "row 0 is not in the schema of openai/graphwalks"),
    "problem_type_unknown": (GRAPHWALKS_ROWS, graphwalks_rows([{**GRAPHWALKS_ROW, "problem_type": "dfs"}]),
                             "row 0 is not in the schema of openai/graphwalks"),
    "prompt_asks_another_operation": (GRAPHWALKS_ROWS, graphwalks_rows([{**GRAPHWALKS_ROW, "problem_type": "bfs"}]),
                                      "row 0's prompt asks no bfs operation"),
}  # fmt: skip

# ---- mrcr: built conversations (data/mrcr.py) and OpenAI's rows in a file of their schema

MRCR_RUN = ["run", "mrcr", *PAIR, "--ctx", "2k", "--samples", "1", "--rendering", "plain"]
MRCR_ROW = {
    "prompt": json.dumps(
        [
            {"role": "user", "content": "write a poem about owls"},
            {"role": "assistant", "content": "An owl."},
            {"role": "user", "content": "Prepend ab12 to the 1st (1 indexed) poem about owls."},
        ]
    ),
    "answer": "ab12An owl.",
    "random_string_to_prepend": "ab12",
    "n_needles": 1,
    "desired_msg_index": 1,
    "total_messages": 3,
    "n_chars": 200,
    "date_added": "12-05-2026",
}


def mrcr_file(rows: list | bytes, name: str = "mrcr.jsonl", folder: bool = False):
    """A data file of `rows` (--data-dir {data}: the file, or with `folder` the folder that holds it)."""

    def setup(tmp: Path) -> dict[str, Path]:
        lines = rows if isinstance(rows, bytes) else "".join(json.dumps(r) + "\n" for r in rows)
        path = _write(tmp / "mrcr" / name, lines)
        return {"data": path.parent if folder else path}

    return setup


MRCR_OPENAI = [*MRCR_RUN, "--source", "openai", "--needles", "1", "--data-dir", "{data}"]
MRCR = {
    "no_chat_template_without_the_plain_rendering": (["run", "mrcr", *PAIR, "--ctx", "2k", "--samples", "1"], None,
                                                     "has no chat template in its tokenizer: pass --rendering plain"),
    "more_needles_than_the_length_holds": ([*MRCR_RUN, "--ctx", "1k", "--needles", "8"], None,
                                           "--needles 8 do not fit --ctx 1024 for model diff: at most"),
    "ctx_below_one_turn": ([*MRCR_RUN, "--ctx", "100"], None, "--ctx 100 is below what one turn needs"),
    "index_beyond_the_needle_count": ([*MRCR_RUN, "--needles", "2,4", "--index", "3"], None,
                                      "--index 3 is beyond the needle count 2"),
    "chat_template_beside_the_plain_rendering": ([*MRCR_RUN, "--chat-template"], None,
                                                 "--chat-template and --rendering plain contradict"),
    "replies_from_noise": ([*MRCR_RUN, "--replies", "noise"], None, "replies are real text"),
    "data_dir_without_the_openai_source": ([*MRCR_RUN, "--data-dir", "{data}"], mrcr_file([MRCR_ROW]),
                                           "applies only with --source openai"),
    "data_file_missing": ([*MRCR_OPENAI[:-1], "/no/such/mrcr.jsonl"], None, "does not exist"),
    "data_folder_without_a_file": (MRCR_OPENAI, mrcr_file([MRCR_ROW], "other.jsonl", folder=True),
                                   "holds neither mrcr.parquet"),
    "data_line_not_json": (MRCR_OPENAI, mrcr_file(b"{not json\n"), "line 1 is not JSON"),
    "data_in_another_schema": (MRCR_OPENAI, mrcr_file([{"document": "x", "summary": "y"}]),
                               "not OpenAI's MRCR schema"),
    "data_prompt_not_messages": (MRCR_OPENAI, mrcr_file([{**MRCR_ROW, "prompt": "[1, 2]"}]),
                                 "must be a JSON list of role/content messages"),
    "data_index_not_a_reply": (MRCR_OPENAI, mrcr_file([{**MRCR_ROW, "desired_msg_index": 0}]),
                               "desired_msg_index 0 is not an assistant message"),
    "data_parquet_not_parquet": (MRCR_OPENAI, mrcr_file(b"not parquet", "mrcr.parquet"), "cannot read"),
}  # fmt: skip

OUTLIERS_RUN = ["run", "outliers", *PAIR, "--ctx", "1k", "--tokens", "2k"]
OUTLIERS = {
    "tokens_superscript": ([*OUTLIERS_RUN, "--tokens", "²k"], None, "bad context length '²k'"),
    "tokens_zero": ([*OUTLIERS_RUN, "--tokens", "0"], None, "bad context length '0'"),
    "two_lengths": ([*OUTLIERS_RUN, "--ctx", "1k,2k"], None, "give one sequence length"),
    "essay_not_utf8": ([*OUTLIERS_RUN, "--haystack", "essays:{essays}"], ESSAY_NOT_UTF8, "is not UTF-8 text"),
}  # fmt: skip


def suite(text: str):
    def setup(tmp: Path) -> dict[str, Path]:
        return {"suite": _write(tmp / "suite" / "suite.yaml", text)}

    return setup


SUITE = {
    "a_probe_option_beside_the_other_probe": (
        ["run", "suite", "{suite}"],
        suite("suite: s\ntasks:\n  - task: distractor-attention\n    ctx: 1k\n    probe: vt\n    keys: 3\n"),
        "--keys 3 applies only with --probe mk-niah",
    ),
    "a_count_out_of_range_in_a_list": (
        ["run", "suite", "{suite}"],
        suite("suite: s\ntasks:\n  - task: needle\n    ctx: 1k\n    depths: [0, 50, 120]\n"),
        "depth 120 is outside 0-100",
    ),
    "a_data_option_beside_a_source_it_does_not_read": (
        ["run", "suite", "{suite}"],
        suite("suite: s\ntasks:\n  - task: nll\n    ctx: 1k\n    data: hf:some/set\n    data_dir: /tmp\n"),
        "--data-dir /tmp applies only with --data books",
    ),
}

TABLES = {
    "nll": NLL, "needle": NEEDLE, "attention": ATTENTION, "mk-niah": MK_NIAH, "mv-niah": MV_NIAH, "vt": VT, "cwe": CWE,
    "nolima": NOLIMA, "distractor-attention": DISTRACTOR_ATTENTION, "icl": ICL, "hallucination": HALLUCINATION,
    "mrcr": MRCR, "longbench2": LONGBENCH2, "graphwalks": GRAPHWALKS, "outliers": OUTLIERS, "suite": SUITE,
}  # fmt: skip
CASES = [(command, case) for command, table in TABLES.items() for case in table]


@pytest.mark.parametrize(("command", "case"), CASES, ids=[f"{command}-{case}" for command, case in CASES])
def test_damage_is_refused_in_one_line_and_in_place(command, case, tmp_path, tiny_models):
    args, setup, message = TABLES[command][case]
    paths = {"tiny": tiny_models["diff"], **(setup(tmp_path) if setup else {})}
    args = [arg.format(**paths) for arg in args]
    kept = tuple(path if path.is_dir() else path.parent for name, path in paths.items() if name != "tiny")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert_refused_in_place(cwd, args, message, kept=kept)


def test_every_run_task_has_a_table():
    from diffeval.tasks import TASKS

    lm_eval = {"quantize", "zeroshot"}  # their refusals need lm-eval's task index (tests/test_refusals.py, slow)
    assert set(TASKS) - lm_eval <= set(TABLES)

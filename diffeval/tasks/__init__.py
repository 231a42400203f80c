"""Task families by name. Each module exposes make_samples, evaluate, SUMMARY_KEYS, PAIR_KEYS, METRICS, TABLE_NOTE and
tables(records); optionally check_inputs(config), prepare(config), batches(todo, config), build_prompts(...) and
plots(records, folder)."""

from diffeval.tasks import attention, hallucination, icl, needle, outliers, quantize, zeroshot

TASKS = {
    "needle": needle,
    "attention": attention,
    "icl": icl,
    "hallucination": hallucination,
    "outliers": outliers,
    "quantize": quantize,
    "zeroshot": zeroshot,
}

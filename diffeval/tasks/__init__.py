"""Task families by name. Each module exposes make_samples, check_inputs, evaluate, SUMMARY_KEYS, TABLE_NOTE and
tables(records); plots(records, folder) where the task has figures."""

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

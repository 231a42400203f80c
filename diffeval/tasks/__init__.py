"""Task families by name. Each module exposes SUMMARY_KEYS, TABLE_NOTE and tables(records)."""

from diffeval.tasks import needle

TASKS = {"needle": needle}

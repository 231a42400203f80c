"""The DIFF variants diffeval runs: one package per variant (its record, its transformers module, its vLLM module,
its checkpoint checks), `base` (what a record is) and `registry` (the one list of records, and the registrations with
transformers and vLLM built from it)."""

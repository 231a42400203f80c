"""The long-context toolkit every retrieval task is a recipe on top of.

- `fitting`: token-exact fitting of a haystack prompt (head, haystack with sentences inserted at depths, tail, answer
  prefix) into a model's budget, on a haystack stream cached per model, with the token spans of what was inserted;
  and the token estimate a dry run sizes prompts with.
- `scoring`: named scoring rules (`default`, `ruler`, and any a task registers), which `report --scoring` rescores
  stored outputs by.
- `lengths`: context-length names (4K), effective length (NoLiMa) with its stratified bootstrap interval, and
  position curves.

It sits above the models (it reads the Backend and tokenizer protocols) and below the tasks, which import it.
"""

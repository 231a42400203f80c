"""Tasks over generated documents: a structured document built here from a seed (a graph's edge list), sized to each
model's budget token by token, and one question whose answer is computed from exactly what the model saw. A family
task may also read published rows of the same kind (OpenAI's `openai/graphwalks`) and score them the same way."""

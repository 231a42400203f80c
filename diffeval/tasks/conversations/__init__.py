"""Tasks over given documents and conversations: a prompt built from a template around given text, through each
model's chat template, and a generated answer judged against the text. The family shares fitting a document into the
budget through the chat template (`prompts`) and the judging stage: degenerate outputs, primary and further judges,
and the judges' agreement (`judging`)."""

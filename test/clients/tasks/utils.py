"""The documents of the parity_choice and parity_generate tasks (docs.jsonl beside this file),
as the `datasets` object lm-evaluation-harness reads: one split, "test". The YAML files name
this loader with custom_dataset, so that the documents are found from wherever lm_eval runs."""
import json
import os

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs.jsonl")


def read_docs():
    """The documents, in file order, as dictionaries."""
    with open(DOCS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_docs(**kwargs):
    import datasets
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(read_docs())})

"""Check that a sequence classifier fine-tuned by lazytrain loads in `transformers`.

Usage: python3 scripts/check_hf_classifier.py LAZYTRAIN_BINARY MODEL_DIR

1. AutoModelForSequenceClassification.from_pretrained(MODEL_DIR) reports no missing,
   unexpected or mis-shaped keys, and its id2label has lazytrain's label names.
2. transformers' text-classification pipeline and `lazytrain text-classification`
   agree on every label's score (to 1e-4).
Optional in CI: .ci/run calls it only when `import transformers` works.
"""
import json
import subprocess
import sys

from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline


def main():
    binary, folder = sys.argv[1], sys.argv[2]
    model, info = AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"transformers reports {problems}"
    with open(f"{folder}/config.json") as f:
        ours_labels = json.load(f)["id2label"]
    assert {str(k): v for k, v in model.config.id2label.items()} == ours_labels, (model.config.id2label, ours_labels)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = ["the hotel was lovely .", "our trip was not great ."]
    n = len(ours_labels)
    ours = json.loads(subprocess.check_output([binary, "text-classification", "--model", folder, "--json", "--top-k", str(n)] + texts))
    theirs = pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None)(texts)
    worst = 0.0
    for a, b in zip(ours, theirs):
        scores = {x["label"]: x["score"] for x in b}
        for x in a:
            worst = max(worst, abs(x["score"] - scores[x["label"]]))
    assert worst < 1e-4, f"scores differ by {worst}"
    print(f"ok: {folder} loads with AutoModelForSequenceClassification, labels {ours_labels}, scores within {worst:.1e}")


if __name__ == "__main__":
    main()

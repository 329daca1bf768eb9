"""Check that a folder written by lazytrain loads in `transformers` and agrees with lazytrain.

Usage: python3 scripts/check_hf_export.py LAZYTRAIN_BINARY MODEL_DIR

1. AutoModelForMaskedLM.from_pretrained(MODEL_DIR) reports no missing or unexpected keys;
   AutoTokenizer.from_pretrained(MODEL_DIR) loads.
2. The fill-mask and feature-extraction outputs of `lazytrain` and of transformers'
   pipelines agree (scores and features to 1e-4).
Optional in CI: .ci/run calls it only when `import transformers` works.
"""
import json
import subprocess
import sys

from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline


def main():
    binary, folder = sys.argv[1], sys.argv[2]
    model, info = AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"transformers reports {problems}"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    mask = tokenizer.mask_token
    text = f"the capital of france is {mask} ."
    ours = json.loads(subprocess.check_output([binary, "fill-mask", "--model", folder, "--json", "--top-k", "3", text]))
    theirs = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)(text)
    for a, b in zip(ours, theirs):
        assert a["token"] == b["token"], (a, b)
        assert abs(a["score"] - b["score"]) < 1e-4, (a, b)
    ours = json.loads(subprocess.check_output([binary, "feature-extraction", "--model", folder, "--json", "hello world"]))
    theirs = pipeline("feature-extraction", model=folder, tokenizer=tokenizer)("hello world")
    worst = max(abs(x - y) for ra, rb in zip(ours[0], theirs[0]) for x, y in zip(ra, rb))
    assert worst < 1e-4, f"features differ by {worst}"
    print(f"ok: {folder} loads in transformers and matches lazytrain (max feature difference {worst:.2e})")


if __name__ == "__main__":
    main()

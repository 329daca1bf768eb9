"""Check that tokenizers trained by lazytrain tokenize the same in `transformers`.

Usage: python3 scripts/check_hf_tokenizers.py LAZYTRAIN_BINARY CORPUS WORK_DIR

Trains a WordPiece (BERT style) and a byte-level BPE (RoBERTa style)
tokenizer on CORPUS with `lazytrain train-tokenizer`, then checks that
AutoTokenizer.from_pretrained (BertTokenizerFast / RobertaTokenizerFast, which
rebuild parts of the pipeline from tokenizer_config.json) gives exactly the
ids of the saved tokenizer.json itself.
Optional in CI: .ci/run calls it only when `import transformers` works.
"""
import os
import subprocess
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

TEXTS = ["Congress shall act.", "The People of the United States", "Héllo WORLD, again!"]


def main():
    binary, corpus, work = sys.argv[1], sys.argv[2], sys.argv[3]
    for model, style in [("wordpiece", "bert"), ("bpe", "roberta")]:
        out = os.path.join(work, f"{model}-{style}")
        subprocess.check_call(
            [binary, "train-tokenizer", "--files", corpus, "--model", model, "--style", style,
             "--vocab-size", "600", "--output", out],
            stdout=subprocess.DEVNULL,
        )
        theirs = AutoTokenizer.from_pretrained(out)
        ours = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        for text in TEXTS:
            a, b = theirs(text)["input_ids"], ours.encode(text).ids
            assert a == b, f"{model}/{style} {type(theirs).__name__} on {text!r}: transformers {a}, lazytrain {b}"
        print(f"ok: {model}/{style} tokenizes the same in {type(theirs).__name__}")


if __name__ == "__main__":
    main()

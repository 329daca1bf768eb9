"""Check that a GPT-2 folder exported by lazytrain loads in `transformers` and agrees with lazytrain.

Usage: python3 scripts/check_hf_gpt2.py LAZYTRAIN_BINARY MODEL_DIR WORK_DIR

1. AutoModelForCausalLM.from_pretrained(MODEL_DIR) reports no missing, unexpected or
   mismatched keys; AutoTokenizer.from_pretrained(MODEL_DIR) is a GPT-2 tokenizer and
   tokenizes like lazytrain (checked through the generations).
2. Greedy `lazytrain text-generation` equals transformers' text-generation pipeline.
3. The mean next-token loss on held-out text (prepared by `lazytrain prepare`, evaluated by
   `lazytrain train --do-train false --do-eval true`) equals transformers' on the same
   blocks within 1e-4.
Optional in CI: .ci/run calls it only when `import transformers` works.
"""
import glob
import json
import os
import struct
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

HELD_OUT = [
    "the capital of the north is a city by the river .",
    "a small red bird flies over the sea at night .",
    "the king walks to the old green tree and the river .",
    "one two three four five six seven eight nine ten .",
] * 3


def varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(data):
    """(field number, wire type, value) of a protobuf message (varints and length-delimited only)."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 2:
            length, i = varint(data, i)
            value, i = data[i:i + length], i + length
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield number, wire, value


def input_ids(example):
    """The `input_ids` int64 list of a serialized tf.train.Example."""
    for _, _, features in fields(example):
        for _, _, entry in fields(features):
            entry = dict((n, v) for n, _, v in fields(entry))
            if entry[1] == b"input_ids":
                for n, wire, int64_list in fields(entry[2]):
                    assert n == 3, "an int64_list"
                    for _, w, packed in fields(int64_list):
                        values, i = [], 0
                        while i < len(packed):
                            v, i = varint(packed, i)
                            values.append(v)
                        return values
    raise ValueError("no input_ids")


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        (length,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + length]
        i += 12 + length + 4


def main():
    binary, folder, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"transformers reports {problems}"
    assert type(model).__name__ == "GPT2LMHeadModel", type(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.mask_token is None, tokenizer

    prompts = ["the capital of", "the river", "in the north the"]
    ours = json.loads(subprocess.check_output([binary, "text-generation", "--model", folder, "--json",
                                               "--max-new-tokens", "12", *prompts]))
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    for prompt, mine in zip(prompts, ours):
        theirs = generator(prompt, max_new_tokens=12, do_sample=False)
        assert mine[0]["generated_text"] == theirs[0]["generated_text"], (mine, theirs)

    text = os.path.join(work, "held-out.txt")
    with open(text, "w") as f:
        f.write("\n".join(HELD_OUT) + "\n")
    data = os.path.join(work, "held-out-data")
    subprocess.check_call([binary, "prepare", "--tokenizer", folder, "--files", text, "--block-size", "16",
                           "--validation-fraction", "0.5", "--num-shards", "1", "--output", data])
    out = os.path.join(work, "eval")
    subprocess.check_call([binary, "train", "--task", "causal-lm", "--model", folder, "--eval-data", data,
                           "--do-train", "false", "--do-eval", "true", "--output-dir", out,
                           "--per-device-eval-batch-size", "4"])
    with open(os.path.join(out, "eval_results.json")) as f:
        mine = json.load(f)["eval_loss"]
    blocks = [input_ids(r) for shard in sorted(glob.glob(os.path.join(data, "validation-*.tfrecord")))
              for r in records(shard)]
    ids = torch.tensor(blocks)
    with torch.no_grad():
        theirs = model(input_ids=ids, labels=ids).loss.item()
    assert abs(mine - theirs) < 1e-4, f"held-out loss: lazytrain {mine}, transformers {theirs}"
    print(f"ok: {folder} loads in transformers; greedy text and held-out loss agree "
          f"({len(blocks)} blocks, loss {mine:.6f} vs {theirs:.6f})")


if __name__ == "__main__":
    main()

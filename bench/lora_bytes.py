#!/usr/bin/env python3
"""What a round sends for a peft LoRA model: the same randomly initialised
LlamaForCausalLM trained three ways, side by side in one run, each by two
learners (threads of this process) over loopback, synchronous rounds:

- full: every parameter trained and exchanged (the baseline);
- lora: peft LoRA adapters trained, the frozen base left out (mend's default);
- lora+frozen: the same LoRA model with exchange_frozen_parameters=true
  (what every round sent before frozen parameters were left out).

For each it reports the parameters each learner trains and exchanges, the
bytes one learner sent per round (`stats()["bytes_sent"] / rounds`), the
bytes per exchanged parameter, and the bytes against the full model's.
It needs torch 2.x with transformers and peft (the venv of
requirements/torch2.txt). It prints a table and writes
bench-results/lora_bytes.csv.

    PYTHONPATH=build/python $(scripts/torch2-venv.sh)/bin/python bench/lora_bytes.py
    ... bench/lora_bytes.py --hidden 1024 --layers 8 --rank 8
"""
import argparse
import copy
import os
import sys
import threading
import time

import peft
import torch
import transformers

import mend
from delay_sweep import print_table, write_csv  # this folder's (the script's own directory is on sys.path)

TOKEN = "lora-bytes-bench-token-0123456789"


def model_of(args):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=args.hidden * 8 // 3, num_hidden_layers=args.layers,
                                      num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64,
                                      max_position_embeddings=args.length)
    return transformers.LlamaForCausalLM(config)


def lora_of(model, args):
    config = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return peft.get_peft_model(model, config)


def run(setup, start, args, address):
    """Two learners of one job train copies of ``start``; each one's stats and counts."""
    models = [copy.deepcopy(start) for _ in range(2)]
    config = mend.MendConfig(lighthouse=address, quorum_min_learners=2, sync_period_steps=args.period,
                             concurrent_outer_step=False, exchange_frozen_parameters=setup == "lora+frozen",
                             log_level="warn", dataplane_host="127.0.0.1")
    optimizers = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4) for m in models]
    runtimes = [mend.mend_init(m, config, f"{setup}-{i}", optimizer=o)
                for i, (m, o) in enumerate(zip(models, optimizers))]
    errors = []

    def learn(i):
        try:
            generator = torch.Generator().manual_seed(i)
            for _ in range(args.period * args.rounds):
                ids = torch.randint(0, args.vocab, (2, args.length), generator=generator)
                loss = models[i](input_ids=ids, labels=ids).loss
                optimizers[i].zero_grad()
                loss.backward()
                optimizers[i].step()
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    begin = time.monotonic()
    threads = [threading.Thread(target=learn, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - begin
    if errors:
        raise errors[0]
    stats = runtimes[0].stats()
    phases = runtimes[0].round_phases()
    exchanged = sum(p.numel() for p in runtimes[0]._parameters)
    for m in models:
        mend.mend_shutdown(m)
    rounds = max(stats["rounds"], 1)
    return {
        "setup": setup,
        "parameters": sum(p.numel() for p in start.parameters()),
        "trainable": sum(p.numel() for p in start.parameters() if p.requires_grad),
        "exchanged": exchanged,
        "rounds": stats["rounds"],
        "bytes_per_round": stats["bytes_sent"] / rounds,
        "bytes_per_exchanged": stats["bytes_sent"] / rounds / exchanged,
        "round_s": phases["round"] / rounds,
        "job_s": round(seconds, 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--period", type=int, default=2, help="H, inner steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--csv", default="bench-results/lora_bytes.csv")
    args = parser.parse_args()
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    base = model_of(args)
    lora = lora_of(copy.deepcopy(base), args)
    rows = []
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         log_level="warn")) as lighthouse:
        for setup, start in (("full", base), ("lora", lora), ("lora+frozen", lora)):
            print(f"{setup} ...", file=sys.stderr, flush=True)
            rows.append(run(setup, start, args, lighthouse.address))
    full = rows[0]["bytes_per_round"]
    for r in rows:
        r["bytes_vs_full"] = r["bytes_per_round"] / full
        r["trainable_vs_full"] = r["trainable"] / rows[0]["trainable"]
        r["mb_per_round"] = r["bytes_per_round"] / 1e6
    print(f"LlamaForCausalLM hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; LoRA r={args.rank} "
          f"on q,k,v,o; 2 learners, H={args.period}, {args.rounds} rounds, fp32 codec")
    print_table(rows, [("setup", "setup", ""), ("parameters", "parameters", ","), ("trainable", "trainable", ","),
                       ("exchanged", "exchanged", ","), ("mb_per_round", "MB/round", ".2f"),
                       ("bytes_per_exchanged", "B/exchanged", ".2f"), ("bytes_vs_full", "bytes/full", ".4f"),
                       ("trainable_vs_full", "trainable/full", ".4f"), ("round_s", "round s", ".3f")])
    write_csv(args.csv, rows)
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()

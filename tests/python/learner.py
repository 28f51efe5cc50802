"""One learner of a Python mend job, as a user would write it: a small model,
torch.optim.AdamW, mend_init / train normally / mend_shutdown. Writes what it
saw (the global parameters after every round, the held-out loss) as JSON."""
import argparse
import faulthandler
import json
import signal
import sys
import time

import torch

from mend import MendConfig, get_runtime, mend_init, mend_shutdown


class TinyLM(torch.nn.Module):
    """A byte-level bigram-ish model: embedding, one hidden layer, logits."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 64)

    def forward(self, tokens):
        return self.out(torch.tanh(self.hidden(self.embed(tokens))))


class OneHot(torch.nn.Module):
    """TinyLM behind a float (one-hot) input: nothing for mend to count tokens from."""

    def __init__(self):
        super().__init__()
        self.inner = TinyLM()

    def forward(self, one_hot):
        return self.inner(one_hot.argmax(-1))


def batch(generator, n=32):
    # A learnable rule: the next token is (3 * token + 1) mod 64, with noise.
    x = torch.randint(0, 64, (n,), generator=generator)
    noise = torch.randint(0, 64, (n,), generator=generator)
    keep = torch.rand(n, generator=generator) < 0.9
    y = torch.where(keep, (3 * x + 1) % 64, noise)
    return x, y


def train_steps(model, optimizer, steps, seed):
    """`steps` inner steps of cross-entropy on batch()es drawn with `seed`
    (the loss in float32 whatever the model's dtype)."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = batch(generator)
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pass-optimizer", action="store_true")
    parser.add_argument("--ready-file", default="")
    parser.add_argument("--min-learners", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--one-hot", action="store_true", help="a float-input model (no token count)")
    parser.add_argument("--schedule", action="store_true",
                        help="a LambdaLR: 10 warm-up steps, then linear decay to 0 at --steps")
    args = parser.parse_args()
    # SIGUSR1 prints every thread's Python stack (a test that waits too long asks).
    faulthandler.register(signal.SIGUSR1)
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even when this
    # process inherited SIGINT ignored (a test suite started in the
    # background by a non-interactive shell: Python then keeps it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    torch.manual_seed(args.seed)
    model = OneHot() if args.one_hot else TinyLM()
    feed = (lambda x: torch.nn.functional.one_hot(x, 64).float()) if args.one_hot else (lambda x: x)
    args.feed = feed
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1)
    config = MendConfig(lighthouse=args.lighthouse, quorum_min_learners=args.min_learners,
                        sync_period_steps=args.period, concurrent_outer_step=False,
                        grace_window_ms=2000, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                        log_level="warn")
    runtime = mend_init(model, config, args.id,
                        optimizer=optimizer if args.pass_optimizer else None)
    args.scheduler = None
    if args.schedule:
        args.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: (s + 1) / 10 if s < 10 else max(0.0, (args.steps - s) / (args.steps - 10)))
    assert get_runtime(model) is runtime
    held_out = torch.Generator().manual_seed(1000)
    eval_x, eval_y = batch(held_out, 512)
    data = torch.Generator().manual_seed(args.seed)

    def held_out_loss():
        with torch.no_grad():
            model.eval()
            loss = torch.nn.functional.cross_entropy(model(feed(eval_x)), eval_y).item()
            model.train()
            return loss

    seen = {"loss_before": held_out_loss(), "globals": {}, "rounds_at_step": {}, "rates": {},
            "data_ptr": [p.data_ptr() for p in model.parameters()]}
    try:
        train(args, model, optimizer, runtime, data, seen)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    seen["loss_after"] = held_out_loss()
    seen["stats"] = runtime.stats()
    seen["data_ptr_after"] = [p.data_ptr() for p in model.parameters()]
    mend_shutdown(model)
    mend_shutdown(model)  # idempotent
    with open(args.out, "w") as f:
        json.dump(seen, f)


def train(args, model, optimizer, runtime, data, seen):
    rounds = 0
    # Follows the job's step (a heal moves a restarted learner onto it).
    while runtime.stats()["steps"] < args.steps:
        step = runtime.stats()["steps"] + 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        x, y = batch(data)
        loss = torch.nn.functional.cross_entropy(model(args.feed(x)), y)
        optimizer.zero_grad()
        loss.backward()
        before = runtime.stats()
        optimizer.step()  # mend's reducer runs right after it
        if args.scheduler is not None:
            args.scheduler.step()
        stats = runtime.stats()
        if stats["steps"] != before["steps"] + 1 and "moved" not in seen:
            seen["moved"] = [before["steps"] + 1, stats["steps"]]
        seen["rates"][str(stats["steps"])] = optimizer.param_groups[0]["lr"]
        if all(stats[k] == before[k] for k in ("rounds_started", "rounds", "failed_rounds")):
            # a step that neither starts nor applies a round copies no parameters
            seen["quiet_steps"] = seen.get("quiet_steps", 0) + 1
            seen["quiet_copies"] = (seen.get("quiet_copies", 0) + stats["parameter_copies"]
                                    - before["parameter_copies"])
        if stats["rounds"] > rounds:
            rounds = stats["rounds"]
            seen["rounds_at_step"][str(step)] = rounds
            seen["globals"][str(stats["last_round_id"])] = runtime.global_state().tolist()
            if args.ready_file:
                with open(args.ready_file, "w") as f:
                    f.write(str(rounds))


if __name__ == "__main__":
    main()

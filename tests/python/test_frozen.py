"""Frozen parameters (requires_grad=False at mend_init: a LoRA model's base
weights, frozen embeddings) are each learner's own by default: not
exchanged, merged or checkpointed, so a round's bytes scale with the
trainable parameters. exchange_frozen_parameters=True exchanges them too."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import mend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import train_then_leave  # noqa: E402

TOKEN = "frozen-test-token-0123456789"


class FrozenBase(torch.nn.Module):
    """A large frozen base (as a LoRA model's) and a small trainable head."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(64, 64)  # 4160 values, frozen
        self.head = torch.nn.Linear(64, 4)   # 260 values, trained
        for p in self.base.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.tanh(self.base(x)))


def run_job(**keys):
    """Two learners whose frozen bases differ (seeds), two synchronous rounds."""
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=3,
                                 concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                                 log_level="warn", **keys)
        models, optimizers, frozen_before = [], [], []
        for seed in (1, 2):
            torch.manual_seed(seed)
            models.append(FrozenBase())
            frozen_before.append([p.detach().clone() for p in models[-1].base.parameters()])
            optimizers.append(torch.optim.SGD([p for p in models[-1].parameters() if p.requires_grad], lr=0.1))
            mend.mend_init(models[-1], config, f"frozen-{seed}", optimizer=optimizers[-1])

        def learn(i):
            generator = torch.Generator().manual_seed(10 + i)
            for _ in range(6):
                x = torch.randn(8, 64, generator=generator)
                loss = models[i](x).square().mean()
                optimizers[i].zero_grad()
                loss.backward()
                optimizers[i].step()

        stats = train_then_leave(models, learn)
    return models, frozen_before, stats


def test_frozen_parameters_stay_each_learners_own_and_cost_no_bytes():
    models, frozen_before, stats = run_job()
    included, _, included_stats = run_job(exchange_frozen_parameters=True)
    for s, t in zip(stats, included_stats):
        assert s["rounds"] == 2 and t["rounds"] == 2
        # A round sends the trainable 260 values, not the frozen 4160 too.
        assert s["bytes_sent"] * 10 < t["bytes_sent"]
    for model, before in zip(models, frozen_before):
        for p, b in zip(model.base.parameters(), before):
            assert torch.equal(p, b)  # never written
    assert not torch.equal(models[0].base.weight, models[1].base.weight)
    for pa, pb in zip(models[0].head.parameters(), models[1].head.parameters()):
        assert torch.equal(pa, pb)  # the trainable ones: the job's, after the last round
    # Included, the frozen ones are merged like the others.
    for pa, pb in zip(included[0].parameters(), included[1].parameters()):
        assert torch.equal(pa, pb)


def test_a_model_with_nothing_trainable_is_refused():
    model = FrozenBase()
    for p in model.head.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="exchange_frozen_parameters"):
        mend.mend_init(model, mend.MendConfig(lighthouse="127.0.0.1:1", log_level="error"), "frozen-none")


def test_a_peft_lora_models_rounds_send_its_adapters_only():
    """A peft LoRA LlamaForCausalLM: a round's bytes are 4 per trainable
    (adapter) value, and the learners' adapters leave it identical."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))
    start = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in start.parameters() if p.requires_grad)
    total = sum(p.numel() for p in start.parameters())
    assert trainable * 50 < total
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                         log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=2,
                                 concurrent_outer_step=False, log_level="warn", dataplane_host="127.0.0.1")
        import copy
        models = [copy.deepcopy(start) for _ in range(2)]
        optimizers = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3) for m in models]
        for i in range(2):
            mend.mend_init(models[i], config, f"lora-{i}", optimizer=optimizers[i])

        def learn(i):
            generator = torch.Generator().manual_seed(i)
            for _ in range(4):
                ids = torch.randint(0, 256, (2, 16), generator=generator)
                loss = models[i](input_ids=ids, labels=ids).loss
                optimizers[i].zero_grad()
                loss.backward()
                optimizers[i].step()

        stats = train_then_leave(models, learn)
    for s in stats:
        assert s["rounds"] == 2
        # fp32 over two members: each sends about its half of the values twice (reduce-scatter, all-gather).
        assert 4 * trainable * 0.9 <= s["bytes_sent"] / s["rounds"] <= 4 * trainable * 1.1 + 4096, s
    adapters = [{n: p for n, p in m.named_parameters() if p.requires_grad} for m in models]
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])

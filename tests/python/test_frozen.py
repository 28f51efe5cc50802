"""Frozen parameters (requires_grad=False at mend_init: a LoRA model's base
weights, frozen embeddings) are not exchanged, merged or checkpointed by
default, so a round's bytes scale with the trainable parameters; every
learner must hold the same ones, which registration checks by digest (a
learner whose frozen weights differ is refused, naming the first that
differs). exchange_frozen_parameters=True exchanges them too."""
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

    def __init__(self, base_seed=0, head_seed=0):
        super().__init__()
        torch.manual_seed(base_seed)
        self.base = torch.nn.Linear(64, 64)  # 4160 values, frozen
        torch.manual_seed(head_seed)
        self.head = torch.nn.Linear(64, 4)   # 260 values, trained
        for p in self.base.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.tanh(self.base(x)))


def lighthouse_and_config(**keys):
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    lighthouse = mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2,
                                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn"))
    config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=3,
                             concurrent_outer_step=False, heartbeat_ms=50, heartbeat_timeout_ms=2000,
                             log_level="warn", **keys)
    return lighthouse, config


def run_job(**keys):
    """Two learners of the same frozen base and heads of their own (seeds),
    two synchronous rounds."""
    lighthouse, config = lighthouse_and_config(**keys)
    with lighthouse:
        models, optimizers, frozen_before = [], [], []
        for seed in (1, 2):
            models.append(FrozenBase(head_seed=seed))
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


def test_frozen_parameters_are_never_written_and_cost_no_bytes():
    models, frozen_before, stats = run_job()
    included, _, included_stats = run_job(exchange_frozen_parameters=True)
    for s, t in zip(stats, included_stats):
        assert s["rounds"] == 2 and t["rounds"] == 2
        # A round sends the trainable 260 values, not the frozen 4160 too.
        assert s["bytes_sent"] * 10 < t["bytes_sent"]
    for model, before in zip(models, frozen_before):
        for p, b in zip(model.base.parameters(), before):
            assert torch.equal(p, b)  # never written
    for pa, pb in zip(models[0].head.parameters(), models[1].head.parameters()):
        assert torch.equal(pa, pb)  # the trainable ones: the job's, after the last round
    # Included, the frozen ones are merged like the others.
    for pa, pb in zip(included[0].parameters(), included[1].parameters()):
        assert torch.equal(pa, pb)


def test_a_learner_whose_frozen_parameters_differ_is_refused_naming_the_first_that_differs():
    lighthouse, config = lighthouse_and_config()
    with lighthouse:
        first = FrozenBase(base_seed=1)
        mend.mend_init(first, config, "frozen-1")
        same = FrozenBase(base_seed=1, head_seed=5)  # (heads may differ: the first round makes them the job's)
        mend.mend_init(same, config, "frozen-same")
        other = FrozenBase(base_seed=1)
        with torch.no_grad():
            other.base.bias[7] += 1e-6  # one value of the second frozen tensor
        with pytest.raises(mend.InvalidArgumentError) as refused:
            mend.mend_init(other, config, "frozen-2")
        message = str(refused.value)
        assert "frozen_parameters = 2 tensors, 4160 values" in message, message
        assert "first difference: item 2, base.bias=" in message, message
        assert mend.get_runtime(other) is None
        for model in (first, same):
            mend.mend_shutdown(model)


def test_a_frozen_digest_is_of_the_bits_whatever_their_layout():
    from mend._frozen import job_setting, tensor_digest
    weight = torch.randn(4, 6)
    assert tensor_digest(weight) == tensor_digest(weight.clone())
    assert tensor_digest(weight.t().contiguous().t()) == tensor_digest(weight)  # (a copy of the same bits)
    assert tensor_digest(weight) != tensor_digest(weight.reshape(6, 4))  # another shape
    assert tensor_digest(weight) != tensor_digest(weight.double())
    swapped = weight.clone()
    swapped[0, 0], swapped[0, 1] = weight[0, 1].item(), weight[0, 0].item()
    assert tensor_digest(swapped) != tensor_digest(weight)
    odd = torch.arange(7, dtype=torch.uint8)  # (bytes that make no wider words)
    assert tensor_digest(odd) != tensor_digest(odd.flip(0))
    assert job_setting([]) is None
    many = [(f"layers.{i}.frozen_weight_with_a_long_name", torch.full((2,), float(i))) for i in range(40)]
    setting = job_setting(many)
    assert setting.startswith("40 tensors, 80 values, digest ") and setting.endswith(" ...")
    assert len("frozen_parameters=" + setting) <= 500


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

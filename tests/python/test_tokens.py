"""Tokens counted from the forward calls, as transformers models are called:
by keyword (``model(input_ids=..., attention_mask=...)``, torch >= 2.0:
the pre-hook sees keyword arguments) or positionally; padding is not a
token (an attention mask's sum); ``report_tokens(n)`` wins. The merge
weighs the learners by them: with outer lr 1 and no momentum a round's
result is the token-weighted mean of the learners' models, computed here
on copies trained without mend."""
import copy
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import mend  # noqa: E402
from mend import _attach  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_threads import train_then_leave  # noqa: E402

TOKEN = "tokens-test-token-0123456789"
VOCAB, LENGTH = 32, 20


class KeywordLM(torch.nn.Module):
    """Called like a transformers causal LM: input_ids, attention_mask, labels."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.out = torch.nn.Linear(8, VOCAB)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        logits = self.out(self.embed(input_ids))
        weight = attention_mask.float() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.float)
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
        return (losses * weight.reshape(-1)).sum() / weight.sum()


def padded_batch(seed, real):
    """2 rows of LENGTH ids whose first `real` positions (in all) are real, the rest padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=generator)
    mask = torch.zeros(2, LENGTH, dtype=torch.long)
    mask.view(-1)[:real] = 1
    return ids, mask


def tiny_llama():
    """A randomly initialised transformers LlamaForCausalLM (nothing downloaded)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def call(model, style, ids, mask):
    if style == "positional":
        out = model(ids, mask, ids)
    else:
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
    return out.loss if hasattr(out, "loss") else out


def trained_without_mend(model, style, ids, mask):  # (a copy: the same start, no mend)
    local = copy.deepcopy(model)
    optimizer = torch.optim.SGD(local.parameters(), lr=0.5)
    call(local, style, ids, mask).backward()
    optimizer.step()
    return [p.detach().clone() for p in local.parameters()]


@pytest.mark.parametrize("style", ["keyword", "positional", "reported", "llama"])
def test_the_merge_weighs_learners_by_their_real_tokens(style):
    if style in ("keyword", "llama") and not _attach.HOOKS_SEE_KEYWORDS:
        pytest.skip("torch 1.13's forward pre-hooks see no keyword arguments")
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    real = (30, 10)  # of 40 positions each: the padding must not count
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=2, heartbeat_ms=50,
                                         heartbeat_timeout_ms=2000, log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=2, sync_period_steps=1,
                                 concurrent_outer_step=False, outer_lr=1.0, outer_momentum=0.0,
                                 heartbeat_ms=50, heartbeat_timeout_ms=2000, log_level="warn")
        torch.manual_seed(3)
        start = tiny_llama() if style == "llama" else KeywordLM()
        models = [copy.deepcopy(start), copy.deepcopy(start)]
        batches = [padded_batch(20 + i, real[i]) for i in range(2)]
        # "reported": the masks say 40 and 40 (no padding), report_tokens the real counts.
        if style == "reported":
            batches = [(ids, torch.ones_like(mask)) for ids, mask in batches]
        how = "positional" if style == "positional" else "keyword"
        locals_ = [trained_without_mend(models[i], how, *batches[i]) for i in range(2)]
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in models]
        for i in range(2):
            mend.mend_init(models[i], config, f"tokens-{i}", optimizer=optimizers[i])

        def learn(i):
            runtime = mend.get_runtime(models[i])
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "no token count" warning
                loss = call(models[i], how, *batches[i])
                if style == "reported":
                    runtime.report_tokens(real[i])
                optimizers[i].zero_grad()
                loss.backward()
                optimizers[i].step()

        stats = train_then_leave(models, learn)
    assert all(s["rounds"] == 1 for s in stats)
    total = sum(real)
    for p0, p1, a, b in zip(models[0].parameters(), models[1].parameters(), *locals_):
        expected = (real[0] * a + real[1] * b) / total
        assert torch.equal(p0, p1)
        assert torch.allclose(p0, expected, rtol=0, atol=1e-6), (p0 - expected).abs().max()
        if not torch.equal(a, b):  # and not the plain mean
            assert not torch.allclose(p0, (a + b) / 2, rtol=0, atol=1e-6)


def test_torch_1_13_says_that_keyword_calls_are_unseen():
    if _attach.HOOKS_SEE_KEYWORDS:
        pytest.skip("this torch's pre-hooks see keyword arguments")
    os.environ["MEND_JOB_TOKEN"] = TOKEN
    model = KeywordLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mend.Lighthouse(mend.MendConfig(bind="127.0.0.1:0", http="", quorum_min_learners=1,
                                         log_level="warn")) as lighthouse:
        config = mend.MendConfig(lighthouse=lighthouse.address, quorum_min_learners=1, sync_period_steps=1000,
                                 log_level="warn")
        mend.mend_init(model, config, "tokens-113", optimizer=optimizer)
        try:
            ids, mask = padded_batch(1, 30)
            with pytest.warns(RuntimeWarning, match="keyword"):
                model(input_ids=ids, attention_mask=mask, labels=ids).backward()
                optimizer.step()
        finally:
            mend.mend_shutdown(model)


def test_a_mask_on_the_inputs_counts_real_tokens_and_other_calls_their_ids():
    model = KeywordLM()
    ids, mask = padded_batch(1, 13)
    assert int(_attach.count_tokens(model, (ids, mask), {})) == 13
    assert int(_attach.count_tokens(model, (ids,), {"attention_mask": mask.bool()})) == 13
    assert _attach.count_tokens(model, (ids,), {}) == 40
    assert _attach.count_tokens(model, (ids, mask.float()), {}) == 40  # a float mask may be additive
    embed = torch.nn.Embedding(VOCAB, 4)
    assert _attach.count_tokens(embed, (ids,), {}) == 40  # no input_ids: the first integer tensor
    assert _attach.count_tokens(embed, (torch.zeros(3),), {}) == 0
    count = _attach.TokenCount()
    count.add(_attach.count_tokens(model, (ids, mask), {}))
    count.add(7)
    assert count.take() == 20 and count.take() == 0

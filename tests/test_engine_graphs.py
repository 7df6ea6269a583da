"""The GPU path: shapes padded to buckets (checked on CPU too) and CUDA-graph replay (on a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.graphs import GraphRunner, bucket
from adaflash.engine.params import Request, SamplingParams
from adaflash.engine.passes import PREFILL_MIN_WIDTH
from adaflash.models.loading import load_target
from tests.test_engine_lossless import drafter_for, generate_with_swap, make_requests, oracle_engine, vanilla


def test_bucket_is_the_next_power_of_two_within_bounds():
    assert [bucket(n, 64) for n in (1, 2, 3, 5, 33, 64, 100)] == [1, 2, 4, 8, 64, 64, 64]
    assert bucket(3, 4096, floor=128) == 128
    assert bucket(129, 200, floor=128) == 200


def test_graph_runner_disabled_calls_through():
    runner = GraphRunner(False)
    assert runner.run("k", lambda x: x * 2, [torch.ones(2)]).tolist() == [2.0, 2.0]
    assert len(runner) == 0


@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash", "eagle3", "mtp"])
def test_padded_shapes_stay_lossless(tiny_target, method):
    """Padding rows to the scratch slot, widths and kv lengths to buckets changes no output."""
    requests = make_requests(tiny_target, n=3, max_new_tokens=24, ignore_eos=True)
    reference = vanilla(tiny_target, requests)
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter,
                    config=EngineConfig(max_batch=5, max_len=512, pad_shapes=True))
    outputs = engine.generate(make_requests(tiny_target, n=3, max_new_tokens=24, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]


def test_padded_oracle_accepts_and_stays_identical(tiny_target):
    reference = vanilla(tiny_target, make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    engine = oracle_engine(tiny_target, make_requests(tiny_target), reference, "adaflash")
    engine.padded = True
    outputs = engine.generate(make_requests(tiny_target, max_new_tokens=40, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert all(o.meta_info["spec_accept_length"] > 1.3 for o in outputs)


def test_cuda_graphs_need_a_gpu(tiny_target):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="CUDA device"):
        Engine(tiny_target, "vanilla", config=EngineConfig(cuda_graphs=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash", "eagle3", "mtp"])
def test_cuda_graph_replay_is_lossless(tiny_llama, method):
    """fp32 on the GPU: graph replay gives the eager CPU engine's greedy tokens, batch sizes mixed."""
    cpu = load_target(str(tiny_llama), device="cpu")
    gpu = load_target(str(tiny_llama), device="cuda", dtype="float32")
    reference = vanilla(cpu, make_requests(cpu, max_new_tokens=32, ignore_eos=True))
    drafter = None if method == "vanilla" else drafter_for(method, gpu)
    engine = Engine(gpu, method, drafter, config=EngineConfig(max_batch=3, max_len=512))
    assert engine.graphs.enabled
    outputs = engine.generate(make_requests(gpu, max_new_tokens=32, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert len(engine.graphs) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_survive_a_swap_to_another_shape(tiny_llama):
    """A swap to a drafter of another shape drops the graphs; capturing again must work."""
    gpu = load_target(str(tiny_llama), device="cuda", dtype="float32")
    cpu = load_target(str(tiny_llama), device="cpu")
    reference = vanilla(cpu, make_requests(cpu, max_new_tokens=24, ignore_eos=True))
    engine = Engine(gpu, "dflash", drafter_for("dflash", gpu), config=EngineConfig(max_batch=4, max_len=512))
    done = generate_with_swap(engine, make_requests(gpu, max_new_tokens=24, ignore_eos=True),
                              drafter_for("adaflash", gpu), version=2)  # gains a length head
    assert [done[f"r{i}"].output_ids for i in range(4)] == [o.output_ids for o in reference]


class _RecordingRunner(GraphRunner):
    """Runs passes eagerly but records the shape keys a GPU would capture graphs for."""

    def __init__(self) -> None:
        super().__init__(False)
        self.enabled = True
        self.keys: set = set()
        self.lanes: dict = {}  # key -> the lane (memory pool) it was run in

    def run(self, key, fn, inputs, lane="decode"):
        self.keys.add(key)
        self.lanes[key] = lane
        return fn(*inputs)


class _ReplayingRunner(GraphRunner):
    """A CUDA graph's data flow on a CPU: the first call of each key runs on static copies of its inputs
    and is kept; later calls copy their inputs into those buffers and run the KEPT function again, as a
    replay re-runs the captured kernels. A pass whose function closes over anything of its own call that
    is not in its key or its inputs gives wrong outputs here, as it would on a GPU."""

    def __init__(self) -> None:
        super().__init__(False)
        self.enabled = True
        self.kept: dict = {}

    def run(self, key, fn, inputs, lane="decode"):
        if key not in self.kept:
            self.kept[key] = (fn, [x.clone() for x in inputs])
        kept, static = self.kept[key]
        for buffer, value in zip(static, inputs, strict=True):
            buffer.copy_(value)
        out = kept(*static)
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in out] if isinstance(out, tuple) else (
            out.clone() if isinstance(out, torch.Tensor) else out)


@pytest.mark.parametrize("method", ["vanilla", "dflash", "adaflash", "eagle3", "mtp"])
def test_replayed_passes_stay_lossless(tiny_target, method):
    """Every pass replayed as a graph would be (prefills, steps, drafts, extends), batch sizes mixed."""
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter,
                    config=EngineConfig(max_batch=4, max_len=256, pad_shapes=True))
    engine.graphs = _ReplayingRunner()
    for n in (3, 1, 4):
        reference = vanilla(tiny_target, make_requests(tiny_target, n=n, max_new_tokens=20, ignore_eos=True))
        outputs = engine.generate(make_requests(tiny_target, n=n, max_new_tokens=20, ignore_eos=True))
        assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert any(key[0] == "prefill" for key in engine.graphs.kept)


def test_rows_for_runs_in_order_where_it_can(tiny_target):
    """Which rows a decode pass runs over: slots 0..b-1 in order where the live ones allow, free slots
    padding when the caller takes results by slot (`fill`), the live rows alone otherwise."""
    padded = Engine(tiny_target, "vanilla",
                    config=EngineConfig(max_batch=8, max_len=256, pad_shapes=True)).passes
    assert padded.rows_for([0, 1, 2, 3], fill=False) == ([0, 1, 2, 3], True)
    assert padded.rows_for([0, 2, 3], fill=True) == ([0, 1, 2, 3], True)  # slot 1 free: it pads
    assert padded.rows_for([0, 2, 3], fill=False) == ([0, 2, 3], False)  # results by row: no padding slot
    assert padded.rows_for([0, 1, 5], fill=True) == ([0, 1, 5], False)  # slot 5 is past the 4 rows padded to
    assert padded.rows_for([0, 1, 2], fill=False) == ([0, 1, 2], False)  # padded to 4 by the scratch slot
    exact = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=8, max_len=256)).passes
    assert exact.rows_for([0, 1, 2], fill=True) == ([0, 1, 2], True)
    assert exact.rows_for([0, 2], fill=True) == ([0, 2], False)  # on a CPU padding costs real work


@pytest.mark.parametrize("method", ["vanilla", "dflash", "eagle3"])
def test_free_slots_pad_replayed_steps_in_order_losslessly(tiny_target, method):
    """Rows finish at different steps and new prompts take their slots: greedy steps run over slots
    0..b-1 in order, free slots as padding, replayed as graphs would be, and every output stays exact."""
    lengths = [6, 30, 12, 24, 9, 17]
    requests = lambda: [Request(r.prompt_ids, SamplingParams(max_new_tokens=n, ignore_eos=True), rid=f"q{i}")  # noqa: E731
                        for i, (r, n) in enumerate(zip(make_requests(tiny_target) * 2, lengths))]
    reference = vanilla(tiny_target, requests())
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter,
                    config=EngineConfig(max_batch=4, max_len=256, pad_shapes=True, admit_batch=2))
    engine.graphs = _ReplayingRunner()
    layouts = []
    rows_for = engine.passes.rows_for
    engine.passes.rows_for = lambda slots, fill: layouts.append((slots, rows_for(slots, fill=fill))) or layouts[-1][1]
    outputs = engine.generate(requests())
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert any(len(rows) > len(slots) and in_order for slots, (rows, in_order) in layouts)  # a free slot padded
    steps = {key for key in engine.graphs.kept if key[0] in ("greedy_step", "draft_and_step")}
    assert any(key[-1] for key in steps)  # steps that read their rows as views (a last row in slot 3 cannot)


@pytest.mark.parametrize("method", ["dflash", "adaflash"])
def test_no_buffer_a_graph_points_at_is_reallocated(tiny_target, method):
    """Graphs keep raw addresses: capturing every shape (up to the widest context) and decoding must leave
    the KV caches, the token and feature buffers where they were. (With max_len under 256 a CPU engine
    allocates them whole, as a GPU one does.)"""
    engine = Engine(tiny_target, method, drafter_for(method, tiny_target),
                    config=EngineConfig(max_batch=2, max_len=200, pad_shapes=True))
    engine.graphs = _RecordingRunner()
    passes = engine.passes
    buffers = lambda: [passes.feats, passes.tokens, passes.cache.k, passes.cache.v, passes.cache.lens,  # noqa: E731
                       passes.draft_cache.k, passes.draft_cache.v, passes.draft_cache.lens]
    addresses = [b.data_ptr() for b in buffers()]
    assert passes.feats.shape[1] == passes.cache.capacity == 200
    engine.capture_graphs()
    assert [b.data_ptr() for b in buffers()] == addresses
    engine.generate(make_requests(tiny_target, n=2, max_new_tokens=30, ignore_eos=True))
    assert [b.data_ptr() for b in buffers()] == addresses


@pytest.mark.parametrize("method", ["adaflash", "eagle3"])
def test_capture_graphs_covers_every_shape_decoding_meets(tiny_target, method):
    """A server captures up front; decoding mixed batches must then meet no shape left uncaptured."""
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter,
                    config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True))
    engine.graphs = _RecordingRunner()
    engine.capture_graphs()
    captured = set(engine.graphs.keys)
    engine.graphs.keys.clear()
    for n in (1, 3, 2):
        engine.generate(make_requests(tiny_target, n=n, max_new_tokens=40, ignore_eos=True))
    assert engine.graphs.keys, "decoding went through the runner"
    assert engine.graphs.keys <= captured, engine.graphs.keys - captured


def decode_kinds(keys) -> set[str]:
    """The kinds of pass decoding replayed, without admissions (the prefill and the drafter's extend
    over the prompt, as wide as the padded prefill)."""
    return {key[0] for key in keys if key[0] != "prefill" and not (key[0] == "extend" and key[2] >= PREFILL_MIN_WIDTH)}


def test_a_greedy_padded_step_is_one_pass(tiny_target):
    """Greedy whole-block decoding on padded shapes drafts, verifies, accepts, commits and extends in
    ONE pass (one graph on a GPU). When the length head chooses, the draft is a pass of its own (the host
    reads the choice); sampled requests keep the separate verify and extend passes."""
    greedy = lambda: make_requests(tiny_target, n=2, max_new_tokens=16, ignore_eos=True)  # noqa: E731
    engine = Engine(tiny_target, "dflash", drafter_for("dflash", tiny_target),
                    config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True))
    engine.graphs = _RecordingRunner()
    engine.generate(greedy())
    assert decode_kinds(engine.graphs.keys) == {"draft_and_step"}
    engine.graphs.keys.clear()
    engine.generate(make_requests(tiny_target, n=2, max_new_tokens=16, ignore_eos=True, temperature=0.8))
    assert decode_kinds(engine.graphs.keys) == {"draft", "verify", "extend"}
    ada = Engine(tiny_target, "adaflash", drafter_for("adaflash", tiny_target),
                 config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True, length_policy="rate"))
    ada.graphs = _RecordingRunner()
    ada.generate(greedy())
    assert decode_kinds(ada.graphs.keys) == {"draft", "greedy_step"}
    plain = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True))
    plain.graphs = _RecordingRunner()
    plain.generate(greedy())
    assert {key[0] for key in plain.graphs.keys} == {"prefill", "greedy_step"}


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_admissions_replay_one_padded_prefill_and_stay_lossless(tiny_target, method, monkeypatch):
    """Prompts of several lengths admitted together take one prefill padded to a power-of-two width (one
    graph on a GPU) and one drafter extend as wide; an admission past PREFILL_TOKENS runs eagerly."""
    from adaflash.engine import passes

    reference = vanilla(tiny_target, make_requests(tiny_target, n=3, max_new_tokens=12, ignore_eos=True))
    engine = Engine(tiny_target, method, drafter_for(method, tiny_target),
                    config=EngineConfig(max_batch=4, max_len=256, pad_shapes=True))
    engine.graphs = _RecordingRunner()
    requests = make_requests(tiny_target, n=3, max_new_tokens=12, ignore_eos=True)
    width = max(len(r.prompt_ids) for r in requests)
    outputs = engine.generate(requests)
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    padded = bucket(width, 256, floor=PREFILL_MIN_WIDTH)
    assert [key for key in engine.graphs.keys if key[0] == "prefill"] == [("prefill", 4, padded)]
    assert ("extend", 4, padded, max(128, padded), False) in engine.graphs.keys  # the admitted rows, gathered
    # an admission's graphs have a memory pool of their own
    admit = {key for key, lane in engine.graphs.lanes.items() if lane == "admit"}
    assert admit == {("prefill", 4, padded), ("extend", 4, padded, max(128, padded), False)}
    assert set(engine.graphs.lanes.values()) == {"admit", "decode"}
    monkeypatch.setattr(passes, "PREFILL_TOKENS", 8)  # every admission is now too wide for a graph
    engine.graphs.keys.clear()
    outputs = engine.generate(make_requests(tiny_target, n=3, max_new_tokens=12, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    assert not any(key[0] == "prefill" for key in engine.graphs.keys)


def test_a_settled_whole_block_drafts_without_the_length_head(tiny_target):
    """Once the cost rule has settled on whole blocks, greedy steps draft inside the one-pass step
    without the head, and a server's up-front capture covers those graphs and both draft variants."""
    from adaflash.engine.length_policy import CostRule

    drafter = drafter_for("adaflash", tiny_target)
    engine = Engine(tiny_target, "adaflash", drafter,
                    config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True, length_policy="cost"))
    engine.graphs = _RecordingRunner()
    engine.capture_graphs()
    captured = set(engine.graphs.keys)
    assert {key[-1] for key in captured if key[0] == "draft"} == {True, False}  # with and without the head
    rule = engine.cost_rule = CostRule(drafter.block_size, engine.min_length, max_batch=3, refresh=0)
    for batch in (1, 2, 4):
        while (width := rule.probe(batch)) is not None:
            rule.record(batch, width, 1.0)
    calls = []
    drafter.length_head.register_forward_hook(lambda *_: calls.append(1))
    engine.graphs.keys.clear()
    engine.generate(make_requests(tiny_target, n=2, max_new_tokens=16, ignore_eos=True))
    used = set(engine.graphs.keys)
    assert decode_kinds(used) == {"draft_and_step"} and used <= captured  # drafts inside the step, no head
    assert not calls  # the head never ran


def test_verify_widths_the_head_picks_replay_at_their_own_width(tiny_target):
    """Where the length head picks widths, a verify below the whole block replays at its own width (a
    verify of 3 padded to 4 costs what 4 do; at 8B on an H100 a step verifying 5 of a block of 8 cost as
    much as the whole block): the up-front capture holds every width, the steps use only captured
    graphs and keep Vanilla's tokens. Without the head (DFlash), and for a sampled verify, widths stay
    powers of two."""
    reference = vanilla(tiny_target, make_requests(tiny_target, n=3, max_new_tokens=16, ignore_eos=True))
    ada = Engine(tiny_target, "adaflash", drafter_for("adaflash", tiny_target),
                 config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True, length_policy="rate", length_rate=1.5))
    ada.graphs = _RecordingRunner()
    ada.capture_graphs()
    captured = set(ada.graphs.keys)
    widest = ada.passes.widest
    assert widest >= 3 and {key[2] for key in captured if key[0] == "greedy_step"} == set(range(1, widest + 1))
    # a sampled verify's graphs hold a step's logits: their widths stay powers of two
    assert {key[2] for key in captured if key[0] == "verify"} == {bucket(w, widest) for w in range(1, widest + 1)}
    ada.graphs.keys.clear()
    outputs = ada.generate(make_requests(tiny_target, n=3, max_new_tokens=16, ignore_eos=True))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in reference]
    used = {key for key in ada.graphs.keys if key[0] == "greedy_step"}
    assert used <= captured and any(key[2] & (key[2] - 1) for key in used), used  # a width no power of two
    assert ada.passes._dims(2, 3, 100, exact=True)[1] == 3 and ada.passes._dims(2, 3, 100)[1] == 4  # sampled: 4
    dflash = Engine(tiny_target, "dflash", drafter_for("dflash", tiny_target),
                    config=EngineConfig(max_batch=3, max_len=256, pad_shapes=True))
    assert dflash.passes._dims(2, 3, 100, exact=True)[1] == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_silu_mul_gives_the_eager_bits(dtype):
    """The Triton SwiGLU kernel returns, bit for bit, what torch's silu then mul return, for decode,
    verify and prefill row counts, a width that is no multiple of its block, and strided rows."""
    from adaflash.models.kernels import fused_silu_mul_available, silu_mul, silu_mul_eager

    torch.manual_seed(0)
    probe = torch.zeros(1, 2, device="cuda")
    if not fused_silu_mul_available(probe):
        pytest.skip("Triton is not installed")
    for rows, width in ((1, 1536), (4, 1536), (128, 1536), (3, 1000)):
        x = (torch.randn(rows, 2 * width, device="cuda") * 4).to(dtype)
        assert torch.equal(silu_mul(x), silu_mul_eager(x)), (rows, width)
    wide = (torch.randn(5, 4 * 700, device="cuda") * 4).to(dtype)[:, : 2 * 700]  # rows strided by 2800
    assert torch.equal(silu_mul(wide), silu_mul_eager(wide))
    assert silu_mul(x.view(1, 3, -1)).shape == (1, 3, 1000)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_rope_matches_eager_rope_to_rounding_and_copies_values(dtype):
    """The Triton rope over fused heads agrees with eager rope to bf16/fp16 rounding (q/k/v and k/v-only
    layouts, decode, verify and batched shapes, with and without q/k norms) and copies value heads
    bit for bit. (Not bit for bit on q/k: on the H200 its products round differently from torch's
    separate kernels, by up to 2 units in the last place of bf16.)"""
    from adaflash.models.kernels import fused_rope_available, rope_heads
    from adaflash.models.layers import DecoderConfig, RMSNorm, Rotary, apply_rope

    torch.manual_seed(0)
    rotary = Rotary(DecoderConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=9,
                                  num_key_value_heads=3, head_dim=64, vocab_size=32)).cuda()
    q_norm, k_norm = RMSNorm(64, 1e-5).cuda(), RMSNorm(64, 1e-5).cuda()
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    q_norm, k_norm = q_norm.to(dtype), k_norm.to(dtype)
    close = {"atol": 0.05, "rtol": 0.02}
    for b, n in ((1, 1), (1, 4), (3, 5)):
        rope = rotary(torch.randint(0, 500, (b, n), device="cuda"), dtype)
        heads = (torch.randn(b, n, 15, 64, device="cuda") * 3).to(dtype)
        if not fused_rope_available(heads):
            pytest.skip("Triton is not installed")
        fused = rope_heads(heads, rope.cos, rope.sin, 9, 12)
        torch.testing.assert_close(fused, apply_rope(heads, *rope.over(12, 15)), **close)
        assert torch.equal(fused[:, :, 12:], heads[:, :, 12:])
        kv = heads[:, :, 9:].contiguous()
        torch.testing.assert_close(rope_heads(kv, rope.cos, rope.sin, 0, 3), apply_rope(kv, *rope.over(3, 6)), **close)
        with torch.no_grad():
            normed = torch.cat([q_norm(heads[:, :, :9]), k_norm(heads[:, :, 9:12]), heads[:, :, 12:]], dim=2)
            fused = rope_heads(heads, rope.cos, rope.sin, 9, 12, (q_norm.weight, k_norm.weight, 1e-5))
        torch.testing.assert_close(fused, apply_rope(normed, *rope.over(12, 15)), **close)
        assert torch.equal(fused[:, :, 12:], heads[:, :, 12:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["vanilla", "dflash"])
def test_bf16_graph_replay_gives_the_eager_passes_tokens(tiny_llama, method):
    """bf16 on a GPU, where the Triton kernels run: replayed graphs give what the same padded passes
    give run eagerly (captured kernels read their inputs where the replays put them)."""
    gpu = load_target(str(tiny_llama), device="cuda", dtype="bfloat16")
    outputs = []
    for graphs in (True, False):
        drafter = None if method == "vanilla" else drafter_for(method, gpu)
        engine = Engine(gpu, method, drafter,
                        config=EngineConfig(max_batch=3, max_len=512, cuda_graphs=graphs, pad_shapes=True))
        outputs.append([o.output_ids for o in engine.generate(make_requests(gpu, max_new_tokens=32, ignore_eos=True))])
    assert outputs[0] == outputs[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fused_accept_commit_matches_accept_and_commit():
    """The Triton acceptance kernel returns what `accept` does and makes the commit's token and length
    writes, with and without per-row verify counts, for widths 1 (Vanilla) to 9."""
    from adaflash.engine.sampling import accept
    from adaflash.models.kernels import accept_commit, fused_accept_available

    torch.manual_seed(0)
    if not fused_accept_available(torch.zeros(1, device="cuda")):
        pytest.skip("Triton is not installed")
    slots, max_len = 6, 40
    for trial in range(60):
        b, w = int(torch.randint(1, 5, ())), int(torch.randint(1, 10, ()))
        block, post = torch.randint(0, 4, (b, w)), torch.randint(0, 4, (b, w))
        for r in range(b):  # long accepted prefixes, as well as none
            m = int(torch.randint(0, w, ()))
            post[r, :m] = block[r, 1:1 + m]
        lens, rows = torch.randint(0, max_len - w - 1, (b,)), torch.randperm(slots)[:b]
        verify = torch.randint(0, w, (b,)) if trial % 2 else None
        tokens, lengths, draft_lengths = (torch.zeros(slots, max_len + 1, dtype=torch.long, device="cuda"),
                                          torch.zeros(slots, dtype=torch.long, device="cuda"),
                                          torch.zeros(slots, dtype=torch.long, device="cuda"))
        cuda = [t.cuda() for t in (block, post, lens, rows)]
        packed = accept_commit(*cuda, verify.cuda() if verify is not None else None, w - 1, tokens, lengths,
                               draft_lengths).cpu()
        accepted, emitted = accept(block[:, 1:], post, verify)
        counts = verify if verify is not None else torch.full((b,), w - 1)
        assert torch.equal(packed, torch.cat([accepted[:, None], counts[:, None], emitted], dim=1))
        expected = torch.zeros(slots, max_len + 1, dtype=torch.long)
        expected[rows[:, None], lens[:, None] + torch.arange(1, w + 1)] = emitted
        assert torch.equal(tokens.cpu(), expected)
        assert torch.equal(lengths.cpu()[rows], lens + accepted + 1) and torch.equal(draft_lengths, lengths)


def test_prefill_groups_cut_an_admission_by_length_where_padding_costs_more_than_a_pass():
    """Long prompts no longer make every short one in their admission pay their width: the prompts go
    into passes by length, cut where a width bucket changes, when the padding saved outweighs a pass."""
    from adaflash.engine.admission import PASS_POSITIONS, prefill_groups

    exact = lambda rows, longest: rows * longest  # noqa: E731  (eager passes run at the longest prompt's width)
    lengths = [90] * 200 + [170] * 20 + [40] * 10
    groups = prefill_groups(lengths, exact)
    assert [sorted(lengths[i] for i in g) for g in groups] == [[40] * 10 + [90] * 200, [170] * 20]
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    # splitting saves more padded positions than a pass costs, and the cut is the cheapest
    assert exact(230, 170) - (exact(210, 90) + exact(20, 170)) > PASS_POSITIONS
    assert prefill_groups([20] * 10 + [200] * 2, exact) == [list(range(12))]  # a small admission stays whole
    assert prefill_groups([7], exact) == [[0]]


@pytest.mark.parametrize("method", ["vanilla", "dflash"])
def test_an_admission_prefilled_in_passes_by_length_stays_lossless(tiny_target, method, monkeypatch):
    """Prompts of far apart lengths admitted together, each pass padded to its own longest and replayed as
    graphs would be: every answer is the one it gets alone, and the first tokens reach their own rows."""
    from adaflash.engine import admission

    monkeypatch.setattr(admission, "PASS_POSITIONS", 0)  # split wherever a width bucket changes
    base = make_requests(tiny_target)
    prompts = [base[0].prompt_ids[:5], base[1].prompt_ids * 3, base[2].prompt_ids, base[3].prompt_ids[:9]]
    requests = lambda: [Request(ids, SamplingParams(max_new_tokens=12, ignore_eos=True), rid=f"q{i}")  # noqa: E731
                        for i, ids in enumerate(prompts)]
    reference = [vanilla(tiny_target, [r])[0].output_ids for r in requests()]
    drafter = None if method == "vanilla" else drafter_for(method, tiny_target)
    engine = Engine(tiny_target, method, drafter, config=EngineConfig(max_batch=4, max_len=512, pad_shapes=True))
    engine.graphs = _ReplayingRunner()
    widths = []
    prefill = engine.passes.prefill
    engine.passes.prefill = lambda ids, rows, length: widths.append(ids.shape) or prefill(ids, rows, length)
    outputs = engine.generate(requests())
    assert [o.output_ids for o in outputs] == reference
    assert len(widths) >= 2 and len({shape[1] for shape in widths}) >= 2, widths  # passes of their own widths


def test_a_fused_step_brings_back_the_length_heads_prediction(tiny_target):
    """`draft_and_step(predict=True)` ends each row with the head's prediction for the block it drafted, the
    one a head-read draft gives, scaled to an integer; the tokens before it are the plain step's."""
    from adaflash.engine.passes import PREDICTION_SCALE

    drafter = drafter_for("adaflash", tiny_target)

    def fresh():
        engine = Engine(tiny_target, "adaflash", copy.deepcopy(drafter),
                        config=EngineConfig(max_batch=2, max_len=256, pad_shapes=True, length_policy="cost"))
        engine.add(Request(tiny_target.encode(tiny_target.render("Name three colours.")),
                           SamplingParams(max_new_tokens=8, ignore_eos=True)))
        engine._prefill()
        seq = engine.active[0]
        args = (torch.tensor([0]), torch.tensor([seq.pending]), torch.tensor([seq.length]), seq.length)
        return engine.passes, args

    seen = []
    with torch.no_grad():
        passes, args = fresh()
        passes.draft(*args, steps=None, choose=lambda pred, k: seen.append(float(pred[0])))
        with_head = passes.draft_and_step(*args, steps=3, predict=True)
        passes, args = fresh()
        plain_step = passes.draft_and_step(*args, steps=3)
    assert with_head.shape[1] == plain_step.shape[1] + 1
    assert torch.equal(with_head[:, :-1], plain_step)
    assert int(with_head[0, -1]) == round(seen[0] * PREDICTION_SCALE)


def test_capturing_graphs_freezes_the_heap_so_full_collections_stay_short(tiny_target, monkeypatch):
    """After a capture every live object is in the collector's permanent generation: a full collection no
    longer walks the process's hundreds of thousands of objects mid-run. No graphs (a CPU): nothing frozen."""
    import gc
    import weakref

    import adaflash.engine.engine as engine_module

    engine = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=2, max_len=64))
    gc.unfreeze()
    try:
        assert engine.capture_graphs() == 0 and gc.get_freeze_count() == 0
        monkeypatch.setattr(engine_module, "capture_all", lambda *a, **k: 3)
        assert engine.capture_graphs() == 3
        assert gc.get_freeze_count() > 1000
        # an engine a benchmark is done with, held only by its own cycle, is freed at the next capture
        passes = weakref.ref(engine.passes)
        engine.passes.cycle = engine.passes
        del engine
        assert passes() is not None  # frozen with its cycle
        Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=2, max_len=64)).capture_graphs()
        assert passes() is None
    finally:
        gc.unfreeze()

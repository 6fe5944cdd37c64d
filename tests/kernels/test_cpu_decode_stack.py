"""A whole decode step in one native call (kernels/cpu/decode_stack.c): in bf16 bit for bit
the composition of the single kernels that the model's Python forward runs, in fp32 the
torch forward's result up to the order of its sums, with every variant the Llama family
has (q/k/v bias, per-head q/k norms, partial rotary, GQA), and clear refusals."""

import pytest
import torch
import torch.nn.functional as F

from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.decode_stack import DecoderLayerWeights, DecoderStack
from kvdeck.kernels.reference.activation import silu_and_mul_torch
from kvdeck.kernels.reference.attention import paged_attention_torch
from kvdeck.kernels.reference.rmsnorm import rms_norm_torch
from kvdeck.kernels.reference.rope import apply_rope_torch
from tests.kernels.test_cpu_native import needs_kernel

HIDDEN, INTER, BLOCK = 96, 160, 16


def make_layers(num_layers, heads, kv_heads, dim, bias, qk_norm, num_blocks=24, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    q, kv = heads * dim, kv_heads * dim
    return [DecoderLayerWeights(
        input_norm=rand(HIDDEN, scale=1.0), qkv=rand(q + 2 * kv, HIDDEN),
        qkv_bias=rand(q + 2 * kv) if bias else None,
        q_norm=rand(dim, scale=1.0) if qk_norm else None, k_norm=rand(dim, scale=1.0) if qk_norm else None,
        o_proj=rand(HIDDEN, q), post_norm=rand(HIDDEN, scale=1.0), gate_up=rand(2 * INTER, HIDDEN),
        down=rand(HIDDEN, INTER), k_cache=rand(num_blocks, BLOCK, kv_heads, dim, scale=1.0),
        v_cache=rand(num_blocks, BLOCK, kv_heads, dim, scale=1.0), scale=dim ** -0.5)
        for _ in range(num_layers)]


def copy_layers(layers):
    return [DecoderLayerWeights(**{name: value.clone() if name.endswith("cache") else value
                                   for name, value in ((n, getattr(layer, n)) for n in layer.__slots__)})
            for layer in layers]


def python_step(layers, hidden, positions, cos_sin, slots, tables, lens, heads, kv_heads, dim, eps):
    """The model's forward (engine/runner/models/llama.py) over the single native kernels."""
    rows, q_size, kv_size = hidden.shape[0], heads * dim, kv_heads * dim
    residual = None
    for layer in layers:
        if residual is None:
            residual, x = hidden, cpu_native.rms_norm(hidden, layer.input_norm, eps)
        else:
            x, residual = cpu_native.rms_norm(hidden, layer.input_norm, eps, residual)
        qkv = cpu_native.bf16_gemv(x, layer.qkv, layer.qkv_bias)
        q, k, v = qkv.split([q_size, kv_size, kv_size], -1)
        if layer.q_norm is not None:
            q = cpu_native.rms_norm(q.reshape(-1, dim), layer.q_norm, eps)
            k = cpu_native.rms_norm(k.reshape(-1, dim), layer.k_norm, eps)
        q, k = cpu_native.apply_rope_neox(positions, q.reshape(rows, heads, dim),
                                          k.reshape(rows, kv_heads, dim), cos_sin)
        keep = slots >= 0
        layer.k_cache.view(-1, kv_heads, dim)[slots[keep]] = k[keep]
        layer.v_cache.view(-1, kv_heads, dim)[slots[keep]] = v.reshape(rows, kv_heads, dim)[keep]
        attended = cpu_native.decode_attention(q, layer.k_cache, layer.v_cache, tables, lens, layer.scale)
        out = cpu_native.bf16_gemv(attended.reshape(rows, q_size), layer.o_proj)
        x, residual = cpu_native.rms_norm(out, layer.post_norm, eps, residual)
        activated = cpu_native.silu_and_mul(cpu_native.bf16_gemv(x, layer.gate_up))
        hidden = cpu_native.bf16_gemv(activated, layer.down)
    return hidden, residual


def torch_step(layers, hidden, positions, cos_sin, slots, tables, lens, heads, kv_heads, dim, eps):
    """The model's forward over the torch kernels (kernels/dispatch.py's TORCH_OPS), as an
    fp32 model runs it without the stack."""
    rows, q_size, kv_size = hidden.shape[0], heads * dim, kv_heads * dim
    starts = torch.arange(rows + 1, dtype=torch.int32)
    residual = None
    for layer in layers:
        if residual is None:
            residual, x = hidden, rms_norm_torch(hidden, layer.input_norm, eps)
        else:
            x, residual = rms_norm_torch(hidden, layer.input_norm, eps, residual)
        q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).split([q_size, kv_size, kv_size], -1)
        if layer.q_norm is not None:
            q = rms_norm_torch(q.reshape(-1, dim), layer.q_norm, eps)
            k = rms_norm_torch(k.reshape(-1, dim), layer.k_norm, eps)
        q, k = apply_rope_torch(positions, q.reshape(rows, heads, dim), k.reshape(rows, kv_heads, dim),
                                cos_sin)
        keep = slots >= 0
        cache = layer.k_cache.dtype  # an fp16 cache under fp32: rounded as it is written
        layer.k_cache.view(-1, kv_heads, dim)[slots[keep]] = k[keep].to(cache)
        layer.v_cache.view(-1, kv_heads, dim)[slots[keep]] = v.reshape(rows, kv_heads, dim)[keep].to(cache)
        attended = paged_attention_torch(q, layer.k_cache, layer.v_cache, tables, starts, lens, layer.scale,
                                         max_query_len=1, max_seq_len=int(lens.max()))
        out = F.linear(attended.reshape(rows, q_size), layer.o_proj)
        x, residual = rms_norm_torch(out, layer.post_norm, eps, residual)
        hidden = F.linear(silu_and_mul_torch(F.linear(x, layer.gate_up)), layer.down)
    return hidden, residual


def step_inputs(rows, dim, rot_dim, skip_row=None, seed=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(([5, 40, 17, 33] * 5)[:rows], dtype=torch.int32)
    tables = torch.zeros(rows, 3, dtype=torch.int32)
    for r in range(rows):
        tables[r] = torch.arange(3 * r, 3 * r + 3, dtype=torch.int32) + 2  # each row its own blocks
    positions = lens.long() - 1
    slots = tables[torch.arange(rows), positions // BLOCK].long() * BLOCK + positions % BLOCK
    if skip_row is not None:
        slots[skip_row] = -1  # a padding row: its K/V are not written
    cos_sin = torch.randn(64, rot_dim, generator=g)
    hidden = torch.randn(rows, HIDDEN, generator=g).to(dtype)
    return hidden, positions, cos_sin, slots, tables, lens


VARIANTS = pytest.mark.parametrize("heads,kv_heads,dim,rot_dim,bias,qk_norm", [
    (6, 2, 32, 32, False, False),  # Llama: GQA, the whole head rotated
    (4, 4, 48, 48, True, False),  # Qwen2's q/k/v bias, no GQA, a head not a multiple of 32
    (4, 2, 32, 32, False, True),  # Qwen3's per-head q and k norms
    (3, 1, 64, 48, False, False),  # Phi-3: three quarters of the head rotated, multi-query
])


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@VARIANTS
def test_a_step_is_bit_for_bit_the_single_kernels(rows, heads, kv_heads, dim, rot_dim, bias, qk_norm):
    layers = make_layers(3, heads, kv_heads, dim, bias, qk_norm)
    expected_layers = copy_layers(layers)
    hidden, positions, cos_sin, slots, tables, lens = step_inputs(rows, dim, rot_dim,
                                                                  skip_row=1 if rows > 2 else None)
    stack = DecoderStack(layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=rot_dim, eps=1e-6)
    assert stack.takes(hidden)
    out, residual = stack.run(hidden, positions, cos_sin, slots, tables, lens)
    want_out, want_residual = python_step(expected_layers, hidden, positions, cos_sin, slots, tables, lens,
                                          heads, kv_heads, dim, 1e-6)
    assert torch.equal(out, want_out) and torch.equal(residual, want_residual)
    for got, want in zip(layers, expected_layers):  # the same K/V written, nothing else touched
        assert torch.equal(got.k_cache, want.k_cache) and torch.equal(got.v_cache, want.v_cache)
    assert out.abs().max() > 0 and not torch.equal(out, hidden)


@needs_kernel
@pytest.mark.parametrize("cache", [torch.float32, torch.float16])  # fp16: kv_cache_dtype float16
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 20])  # 20: passes of 8, 8 and 4 rows through the GEMV
@VARIANTS
def test_an_fp32_step_is_the_torch_forward_up_to_the_order_of_its_sums(rows, heads, kv_heads, dim, rot_dim,
                                                                        bias, qk_norm, cache):
    """An fp32 step against the torch forward, over an fp32 cache or an fp16 one (llama.cpp's
    default: keys and values rounded to fp16 as they are written, read back widened)."""
    layers = make_layers(3, heads, kv_heads, dim, bias, qk_norm, num_blocks=3 * rows + 2, dtype=torch.float32)
    for layer in layers:
        layer.k_cache, layer.v_cache = layer.k_cache.to(cache), layer.v_cache.to(cache)
    expected_layers = copy_layers(layers)
    hidden, positions, cos_sin, slots, tables, lens = step_inputs(rows, dim, rot_dim, dtype=torch.float32,
                                                                  skip_row=1 if rows > 2 else None)
    stack = DecoderStack(layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=rot_dim, eps=1e-6,
                         max_rows=32)
    out, residual = stack.run(hidden, positions, cos_sin, slots, tables, lens)
    alone, _ = DecoderStack(copy_layers(expected_layers), heads=heads, kv_heads=kv_heads, head_dim=dim,
                            rot_dim=rot_dim, eps=1e-6).run(hidden[-1:], positions[-1:], cos_sin, slots[-1:],
                                                           tables[-1:], lens[-1:])
    assert torch.equal(alone[0], out[-1])  # a row's result does not depend on the step's others
    want_out, want_residual = torch_step(expected_layers, hidden, positions, cos_sin, slots, tables, lens,
                                         heads, kv_heads, dim, 1e-6)
    assert out.dtype == residual.dtype == torch.float32 and layers[0].k_cache.dtype == cache
    # fp32 sums in another order: about 2e-7 of the largest value after one layer, some 5e-6
    # after three random ones (the errors compound); a wrong formula is off by far more. In
    # fp16, a key whose sums round to the other side of an fp16 step moves its attention by
    # up to an fp16 unit (1e-3) of its share.
    tolerance = 2e-5 if cache == torch.float32 else 1e-3
    for got, want in [(out, want_out), (residual, want_residual)] + [
            (a.k_cache, b.k_cache) for a, b in zip(layers, expected_layers)] + [
            (a.v_cache, b.v_cache) for a, b in zip(layers, expected_layers)]:
        want = want.float()
        torch.testing.assert_close(got.float(), want, rtol=0, atol=tolerance * want.abs().max().item())
    untouched = torch.ones(layers[0].k_cache.shape[:2], dtype=torch.bool)
    untouched.view(-1)[slots[slots >= 0]] = False
    fresh = make_layers(3, heads, kv_heads, dim, bias, qk_norm, num_blocks=3 * rows + 2, dtype=torch.float32)
    for got, old in zip(layers, fresh):  # only the step's slots were written
        assert torch.equal(got.k_cache[untouched], old.k_cache[untouched].to(cache))
    assert out.abs().max() > 0 and not torch.equal(out, hidden)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_chunk_of_tokens_is_the_same_as_one_token_at_a_time(dtype):
    """A speculative verify chunk (a decode row and a chunk of three tokens in one step, each
    token a row over its causal context) gives each token exactly what decoding it alone
    after the ones before would: rows never mix, so verification agrees with plain decoding."""
    from kvdeck.kernels.cpu.decode_stack import token_contexts

    heads, kv_heads, dim = 4, 2, 32
    layers = make_layers(2, heads, kv_heads, dim, False, False, dtype=dtype)
    one_at_a_time = copy_layers(layers)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, HIDDEN, generator=g).to(dtype)
    cos_sin = torch.randn(64, dim, generator=g)
    tables = torch.tensor([[2, 3, 4], [5, 6, 7]], dtype=torch.int32)
    seq_lens = torch.tensor([9, 20], dtype=torch.int32)  # sequence 1's last three tokens are the chunk
    starts = torch.tensor([0, 1, 4], dtype=torch.int32)
    positions = torch.tensor([8, 17, 18, 19])
    owner = [0, 1, 1, 1]
    slots = torch.tensor([int(tables[seq, pos // BLOCK]) * BLOCK + int(pos) % BLOCK
                          for seq, pos in zip(owner, positions)])
    token_tables, token_lens = token_contexts(starts, seq_lens, tables)
    assert token_lens.tolist() == [9, 18, 19, 20] and token_tables[1:].tolist() == [tables[1].tolist()] * 3
    stack = DecoderStack(layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim, eps=1e-6)
    chunk_out, chunk_residual = stack.run(hidden, positions, cos_sin, slots, token_tables, token_lens)
    single = DecoderStack(one_at_a_time, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim, eps=1e-6)
    for row in range(4):
        out, residual = single.run(hidden[row:row + 1], positions[row:row + 1], cos_sin, slots[row:row + 1],
                                   tables[owner[row]:owner[row] + 1], token_lens[row:row + 1])
        assert torch.equal(out[0], chunk_out[row]) and torch.equal(residual[0], chunk_residual[row])


@needs_kernel
def test_a_step_in_passes_is_the_step_in_one_call():
    """Built in_passes, a stack takes a step of any size as calls of max_rows tokens: a prompt
    of 21 tokens (its own context, causal) beside two decode rows, in passes of 8, gives
    what one call of all 23 gives, bit for bit, and writes the same cache."""
    from kvdeck.kernels.cpu.decode_stack import token_contexts

    heads, kv_heads, dim = 4, 2, 32
    layers = make_layers(2, heads, kv_heads, dim, False, False, dtype=torch.float32)
    whole_layers = copy_layers(layers)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(23, HIDDEN, generator=g)
    cos_sin = torch.randn(64, dim, generator=g)
    tables = torch.tensor([[2, 3, 4], [5, 6, 7], [8, 9, 10]], dtype=torch.int32)
    seq_lens = torch.tensor([9, 21, 30], dtype=torch.int32)  # a decode row, the prompt, a decode row
    starts = torch.tensor([0, 1, 22, 23], dtype=torch.int32)
    positions = torch.tensor([8, *range(21), 29])
    owner = [0] + [1] * 21 + [2]
    slots = torch.tensor([int(tables[seq, pos // BLOCK]) * BLOCK + int(pos) % BLOCK
                          for seq, pos in zip(owner, positions)])
    token_tables, token_lens = token_contexts(starts, seq_lens, tables)
    in_passes = DecoderStack(layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim, eps=1e-6,
                             max_rows=8, in_passes=True)
    assert in_passes.takes(hidden)
    out, residual = in_passes.run(hidden, positions, cos_sin, slots, token_tables, token_lens)
    whole = DecoderStack(whole_layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim, eps=1e-6,
                         max_rows=32)
    want_out, want_residual = whole.run(hidden, positions, cos_sin, slots, token_tables, token_lens)
    assert torch.equal(out, want_out) and torch.equal(residual, want_residual)
    for got, want in zip(layers, whole_layers):
        assert torch.equal(got.k_cache, want.k_cache) and torch.equal(got.v_cache, want.v_cache)
    before = [layer.k_cache.clone() for layer in layers]
    bad_slots = slots.clone()
    bad_slots[-1] = 10 ** 6  # the last pass's row: refused before the first pass writes
    with pytest.raises(ValueError, match="indexes outside its tables"):
        in_passes.run(hidden, positions, cos_sin, bad_slots, token_tables, token_lens)
    assert all(torch.equal(layer.k_cache, old) for layer, old in zip(layers, before))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_final_norm_ends_the_step_as_the_models_norm_would(dtype):
    """Built with the model's final norm, a step returns that norm of (output + residual) and
    the sum, which is what the forward's `self.norm(hidden, residual)` returns: in bf16 bit
    for bit (the same native kernel), in fp32 up to the order of the sums."""
    heads, kv_heads, dim = 4, 2, 32
    layers = make_layers(2, heads, kv_heads, dim, False, False, dtype=dtype)
    plain_layers = copy_layers(layers)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(9))).to(dtype)
    hidden, positions, cos_sin, slots, tables, lens = step_inputs(3, dim, dim, dtype=dtype)
    normed, summed = DecoderStack(layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim, eps=1e-6,
                                  final_norm=weight).run(hidden, positions, cos_sin, slots, tables, lens)
    out, residual = DecoderStack(plain_layers, heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim,
                                 eps=1e-6).run(hidden, positions, cos_sin, slots, tables, lens)
    if dtype == torch.bfloat16:
        want, want_sum = cpu_native.rms_norm(out, weight, 1e-6, residual.clone())
        assert torch.equal(normed, want) and torch.equal(summed, want_sum)
    else:
        want, want_sum = rms_norm_torch(out, weight, 1e-6, residual)
        assert torch.equal(summed, want_sum)
        torch.testing.assert_close(normed, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(normed, summed)
    with pytest.raises(ValueError, match="the final norm"):
        DecoderStack(copy_layers(plain_layers), heads=heads, kv_heads=kv_heads, head_dim=dim, rot_dim=dim,
                     eps=1e-6, final_norm=weight[:-1])


@needs_kernel
def test_it_leaves_larger_steps_to_the_python_forward_and_refuses_bad_metadata():
    stack = DecoderStack(make_layers(1, 4, 2, 32, False, False), heads=4, kv_heads=2, head_dim=32, rot_dim=32,
                         eps=1e-6)
    assert stack.takes(torch.zeros(cpu_native.GEMV_MAX_ROWS, HIDDEN, dtype=torch.bfloat16))
    assert not stack.takes(torch.zeros(cpu_native.GEMV_MAX_ROWS + 1, HIDDEN, dtype=torch.bfloat16))
    hidden, positions, cos_sin, slots, tables, lens = step_inputs(1, 32, 32)
    with pytest.raises(ValueError, match="bf16 hidden"):
        stack.run(hidden.float(), positions, cos_sin, slots, tables, lens)
    wide = DecoderStack(make_layers(1, 4, 2, 32, False, False, dtype=torch.float32), heads=4, kv_heads=2,
                        head_dim=32, rot_dim=32, eps=1e-6, max_rows=32)
    assert wide.takes(torch.zeros(32, HIDDEN)) and not wide.takes(torch.zeros(33, HIDDEN))
    with pytest.raises(ValueError, match=r"fp32 hidden \[rows <= 32"):
        wide.run(torch.zeros(33, HIDDEN), *step_inputs(1, 32, 32)[1:])  # refused before the metadata
    with pytest.raises(ValueError, match="a slot"):
        stack.run(hidden, positions, cos_sin, slots.repeat(2), tables, lens)
    with pytest.raises(ValueError, match="cos|sin cache of 32 columns"):
        stack.run(hidden, positions, cos_sin[:, :16].contiguous(), slots, tables, lens)


@needs_kernel
def test_an_index_out_of_range_is_refused_before_anything_is_written():
    """The Python path would raise on these (index_copy_, a table lookup); the stack checks
    them all first rather than read or write outside the caches."""
    layers = make_layers(2, 4, 2, 32, False, False, num_blocks=24)
    before = [layer.k_cache.clone() for layer in layers]
    stack = DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    hidden, positions, cos_sin, slots, tables, lens = step_inputs(2, 32, 32)
    bad_steps = {
        "position past the rotary table": (positions + 64, slots, tables, lens),
        "slot past the cache": (positions, slots + 24 * BLOCK, tables, lens),
        "block id past the cache": (positions, slots, tables + 24, lens),
        "context longer than its table": (positions, slots, tables, lens + 3 * BLOCK),
    }
    for why, (bad_positions, bad_slots, bad_tables, bad_lens) in bad_steps.items():
        with pytest.raises(ValueError, match="indexes outside its tables"):
            stack.run(hidden, bad_positions, cos_sin, bad_slots, bad_tables, bad_lens)
        assert all(torch.equal(layer.k_cache, old) for layer, old in zip(layers, before)), why
    stack.run(hidden, positions, cos_sin, slots, tables, lens)  # and the stack still works


@needs_kernel
def test_it_refuses_weights_it_cannot_read_and_names_them():
    layers = make_layers(2, 4, 2, 32, False, False)
    layers[1].qkv = layers[1].qkv[:, :-1]
    with pytest.raises(ValueError, match="layer 1's qkv must be a contiguous bf16 CPU tensor of shape"):
        DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    layers = make_layers(1, 4, 2, 32, False, True)
    layers[0].k_norm = None
    with pytest.raises(ValueError, match="q and k norms come together"):
        DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    with pytest.raises(ValueError, match="kv heads dividing the heads"):
        DecoderStack(make_layers(1, 4, 3, 32, False, False), heads=4, kv_heads=3, head_dim=32, rot_dim=32,
                     eps=1e-6)
    layers = make_layers(1, 4, 2, 32, False, False)
    layers[0].down = layers[0].down.float()
    with pytest.raises(ValueError, match="layer 0's down must be a contiguous bf16"):
        DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    layers = make_layers(1, 4, 2, 32, False, False, dtype=torch.float32)
    layers[0].k_cache = layers[0].k_cache.bfloat16()  # fp32 over a bf16 cache: no step function
    with pytest.raises(ValueError, match="or fp16 one, not torch.float32 over torch.bfloat16"):
        DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    layers = make_layers(2, 4, 2, 32, False, False, dtype=torch.float32)
    layers[1].v_cache = layers[1].v_cache.half()  # each layer's caches of the first layer's dtype
    with pytest.raises(ValueError, match="layer 1's v_cache must be a contiguous fp32"):
        DecoderStack(layers, heads=4, kv_heads=2, head_dim=32, rot_dim=32, eps=1e-6)
    with pytest.raises(ValueError, match="not torch.float16 over torch.float16"):
        DecoderStack(make_layers(1, 4, 2, 32, False, False, dtype=torch.float16), heads=4, kv_heads=2,
                     head_dim=32, rot_dim=32, eps=1e-6)

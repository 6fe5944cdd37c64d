import torch

from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq, unpack_int4
from kvdeck.quant.packing import fake_quantize, pack_awq_weight, pack_int4, quantize_groups
from tests.quant.awq_reference import reference_dequantize, reference_unpack


def test_pack_unpack_round_trip_matches_published_layout():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 16, (24, 64), generator=gen, dtype=torch.int32)
    packed = pack_int4(values)
    assert packed.dtype == torch.int32 and packed.shape == (24, 8)
    assert torch.equal(reference_unpack(packed), values.long())
    assert torch.equal(unpack_int4(packed), values)


def test_pack_layout_by_hand():
    # Columns 0..7 hold 1..8: nibble i stores column [0,2,4,6,1,3,5,7][i].
    packed = pack_int4(torch.arange(1, 9, dtype=torch.int32)[None])
    expected = sum(v << (4 * i) for i, v in enumerate([1, 3, 5, 7, 2, 4, 6, 8]))
    assert packed.item() == expected - 2**32 if expected >= 2**31 else expected


def test_any_int32_bit_pattern_unpacks_to_nibbles():
    # load_format="dummy" fills qweight/qzeros with random int32s over the full range.
    gen = torch.Generator().manual_seed(1)
    packed = torch.randint(-(2**31), 2**31 - 1, (16, 4), generator=gen, dtype=torch.int32)
    values = unpack_int4(packed)
    assert int(values.min()) >= 0 and int(values.max()) <= 15
    assert torch.equal(values.long(), reference_unpack(packed))
    assert torch.equal(pack_int4(values), packed)


def test_quantize_groups_error_is_within_half_a_step():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(32, 256, generator=gen)
    q, scales, zeros = quantize_groups(weight, 64)
    assert q.shape == (32, 256) and scales.shape == (32, 4) and zeros.shape == (32, 4)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    assert int(zeros.min()) >= 0 and int(zeros.max()) <= 15
    step = scales.repeat_interleave(64, dim=1)
    error = (fake_quantize(weight, 64) - weight).abs()
    # Rounding costs at most half a step; the rounded zero point at most one more.
    assert bool((error <= 1.5 * step + 1e-6).all())
    assert float(error.mean()) < 0.3 * float(step.mean())


def test_pack_awq_weight_dequantises_to_the_fake_quantised_weight():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 256, generator=gen) * 0.05
    qweight, qzeros, scales = pack_awq_weight(weight, 128)
    assert qweight.shape == (256, 6) and qzeros.shape == (2, 6) and scales.shape == (2, 48)
    assert scales.dtype == torch.float16
    dense_ref = reference_dequantize(qweight, qzeros, scales, 128)
    dense = dequantize_awq(qweight, qzeros, scales.float(), 128)
    torch.testing.assert_close(dense.double(), dense_ref, rtol=0, atol=1e-6)
    # fp16 scales cost a little precision against the fp32 fake quantisation.
    torch.testing.assert_close(dense.t(), fake_quantize(weight, 128), rtol=1e-2, atol=2e-3)

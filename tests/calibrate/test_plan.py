"""The calibration plan's arithmetic: histogram strides, each sample's share of the budget,
samples counted per batch."""

from __future__ import annotations

import numpy as np

from onnxq.calibrate.plan import MIN_SAMPLE_SHARE, _stride, sample_share


def test_stride_is_a_prime_coprime_to_every_dimension():
    assert _stride(1000, [10, 10, 10], 1000) == 1
    assert _stride(2304, [1, 16, 12, 12], 100) == 29  # 24 -> 29: the next prime
    assert _stride(768 * 64, [1, 64, 768], 1024) == 53  # 48 -> 53
    assert _stride(7 * 49, [1, 7, 7, 7], 100) == 5  # 4 -> 5 (5 divides no dimension)
    assert _stride(11 * 13 * 100, [1, 11, 13, 100], 500) == 29  # skips 11, 13, 17, 19, 23
    for dims in ([1, 64, 56, 56], [1, 3, 224, 224], [1, 128, 768], [4, 17, 19, 23]):
        n = int(np.prod(dims[1:]))
        for target in (64, 1000, 4096):
            s = _stride(n, dims, target)
            assert s >= n / target or s == 1
            assert s == 1 or (all(s % k for k in range(2, s)) and all(d % s for d in dims))


def test_sample_share_follows_the_budget_in_powers_of_two():
    assert sample_share(65536, 2**24, None) == 65536  # unknown sample count: no budget
    assert sample_share(65536, 2**24, 256) == 65536  # 2^24 / 256 = 65536: not lowered
    assert sample_share(65536, 2**24, 257) == 32768  # 65280 rounds down to a power of two
    assert sample_share(65536, 2**24, 512) == 32768
    assert sample_share(65536, 2**24, 1000) == sample_share(65536, 2**24, 1024) == 16384
    assert sample_share(65536, 2**24, 10**9) == MIN_SAMPLE_SHARE
    assert sample_share(500, 2**24, 10**9) == 500  # never above histogram_sample
    assert sample_share(0, 2**24, 10**9) == 0  # 0: every value, whatever the budget
    assert sample_share(65536, 0, 10**9) == 65536  # budget 0: off


def test_an_unbatched_image_input_counts_one_sample_per_batch():
    # torchvision's detectors take [3, H, W]: its fixed 3 is channels, not 3 samples
    from onnxq.calibrate.plan import batch_samples, samples_total
    from onnxq.data.sources import InputSpec

    image = {"image": np.zeros((3, 64, 48), np.float32)}
    unbatched = [InputSpec("image", np.dtype(np.float32), (3, "height", "width"))]
    assert batch_samples(image, unbatched) == 1
    assert samples_total(image, 16, unbatched) == 16
    batched = [InputSpec("image", np.dtype(np.float32), ("n", 64, 48))]
    assert batch_samples(image, batched) == 3
    static = [InputSpec("image", np.dtype(np.float32), (3, 64, 48))]  # no symbol: as given
    assert batch_samples(image, static) == 3
    nchw = {"x": np.zeros((2, 3, 64, 48), np.float32)}  # a fixed batch of 2, dynamic H/W
    assert batch_samples(nchw, [InputSpec("x", np.dtype(np.float32), (2, 3, "h", "w"))]) == 2

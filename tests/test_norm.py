"""Sum-based BatchNorm: exact nn.BatchNorm on the union batch, and FedTAN's client-mean mode."""

import numpy as np
import pytest
import torch
from conftest import DEVICES
from torch import nn

import stratify.nn.norm as norm_module
from stratify.nn.norm import (
    SumBatchNorm,
    SumBatchNorm1d,
    SumBatchNorm2d,
    client_split,
    combine_statistics,
)

BATCH = 8
# (N, C), (N, C, L) and (N, C, H, W) inputs with the layer's dims
SHAPES = {"NC": ((BATCH, 4), 1), "NCL": ((BATCH, 4, 5), 1), "NCHW": ((BATCH, 4, 3, 3), 2)}
FIXED_SPLITS = [[8], [1, 7], [3, 1, 4], [5, 3], [2, 2, 2, 2], [1] * 8]


def random_split(batch_size: int, seed: int) -> list[int]:
    """Random contiguous client sizes (each ≥ 1) summing to ``batch_size``."""
    rng = np.random.default_rng(seed)
    clients = int(rng.integers(2, batch_size + 1))
    cuts = np.sort(rng.choice(np.arange(1, batch_size), size=clients - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [batch_size]])).tolist()


SPLITS = FIXED_SPLITS + [random_split(BATCH, seed) for seed in range(4)]


def make_pair(dims, num_features, device, combine="sum", **kwargs):
    """A SumBatchNorm (own code path even for one client) and an nn.BatchNorm, same state."""
    sum_bn = SumBatchNorm(num_features, dims=dims, combine=combine, **kwargs).to(device)
    sum_bn.native_single_client = False
    reference = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(num_features, **kwargs)
    reference = reference.to(device)
    if sum_bn.affine:
        with torch.no_grad():
            sum_bn.weight.uniform_(0.5, 1.5)
            sum_bn.bias.uniform_(-1.0, 1.0)
    reference.load_state_dict(sum_bn.state_dict())
    return sum_bn, reference


def step(module, x, grad_output, client_sizes=None):
    """One forward/backward; returns output and input gradient (parameter grads stay)."""
    x = x.clone().requires_grad_(True)
    with client_split(module, client_sizes):
        y = module(x)
    y.backward(grad_output)
    return y.detach(), x.grad


def batch(shape, device, seed):
    generator = torch.Generator().manual_seed(seed)
    # a channel offset far from zero exercises the numerically stable path
    x = torch.randn(shape, generator=generator) * 2.0 + 3.0
    return x.to(device), torch.randn(shape, generator=generator).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("split", SPLITS, ids=lambda split: "-".join(map(str, split)))
def test_sum_mode_equals_batchnorm_on_union(device, shape_name, split):
    shape, dims = SHAPES[shape_name]
    sum_bn, reference = make_pair(dims, shape[1], device)
    for seed in range(3):
        x, grad_output = batch(shape, device, seed)
        sum_bn.zero_grad()
        reference.zero_grad()
        y, grad_x = step(sum_bn, x, grad_output, split)
        y_ref, grad_x_ref = step(reference, x, grad_output)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad_x, grad_x_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sum_bn.weight.grad, reference.weight.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sum_bn.bias.grad, reference.bias.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sum_bn.running_mean, reference.running_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sum_bn.running_var, reference.running_var, atol=1e-5, rtol=1e-5)
    assert int(sum_bn.num_batches_tracked) == int(reference.num_batches_tracked) == 3
    sum_bn.eval()
    reference.eval()
    x, grad_output = batch(shape, device, 99)
    y, grad_x = step(sum_bn, x, grad_output, split)
    y_ref, grad_x_ref = step(reference, x, grad_output)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_x, grad_x_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_native_single_client_path_equals_batchnorm(device):
    sum_bn, reference = make_pair(2, 4, device)
    sum_bn.native_single_client = True
    x, grad_output = batch((BATCH, 4, 3, 3), device, 0)
    y, grad_x = step(sum_bn, x, grad_output)
    y_ref, grad_x_ref = step(reference, x, grad_output)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(grad_x, grad_x_ref)
    torch.testing.assert_close(sum_bn.running_var, reference.running_var)
    assert int(sum_bn.num_batches_tracked) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [
        {"momentum": None},
        {"momentum": 0.5, "eps": 1e-3},
        {"affine": False},
        {"track_running_stats": False},
    ],
    ids=["cumulative", "momentum-eps", "no-affine", "no-running-stats"],
)
def test_sum_mode_options_match_batchnorm(device, options):
    sum_bn, reference = make_pair(2, 4, device, **options)
    split = [1, 4, 3]
    for seed in range(3):
        x, grad_output = batch((BATCH, 4, 3, 3), device, seed)
        y, grad_x = step(sum_bn, x, grad_output, split)
        y_ref, grad_x_ref = step(reference, x, grad_output)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad_x, grad_x_ref, atol=1e-5, rtol=1e-5)
    if sum_bn.track_running_stats:
        torch.testing.assert_close(sum_bn.running_mean, reference.running_mean)
        torch.testing.assert_close(sum_bn.running_var, reference.running_var)
    sum_bn.eval()
    reference.eval()
    x, _ = batch((BATCH, 4, 3, 3), device, 7)
    with client_split(sum_bn, split):
        torch.testing.assert_close(sum_bn(x), reference(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_large_offset_is_numerically_stable(device):
    # Σx²/n − mean² in float32 would lose every digit of a unit variance at mean 1e4
    sum_bn, reference = make_pair(1, 3, device)
    x = (torch.randn(64, 3, 16) + 1e4).to(device)
    with client_split(sum_bn, [10, 30, 24]):
        y = sum_bn(x)
    reference_double = reference.double()
    torch.testing.assert_close(y.double(), reference_double(x.double()), atol=2e-3, rtol=0)


def hand_batch(device):
    """Client A holds [0, 2] (mean 1, var 1); client B holds [4, 6, 8, 10] (mean 7, var 5)."""
    return torch.tensor([[0.0], [2.0], [4.0], [6.0], [8.0], [10.0]], device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_client_mean_statistics_are_fedtans(device):
    layer = SumBatchNorm(1, dims=1, combine="client-mean", momentum=1.0, affine=False).to(device)
    x = hand_batch(device)
    with client_split(layer, [2, 4]):
        y = layer(x)
    # global mean (1 + 7) / 2 = 4; variances around it: A (16 + 4) / 2 = 10,
    # B (0 + 4 + 16 + 36) / 4 = 14; their mean 12
    expected = (x - 4.0) / np.sqrt(12.0 + layer.eps)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(layer.running_mean, torch.tensor([4.0], device=device))
    # running variance: unbiased correction with the batch's element count, 12 · 6/5
    torch.testing.assert_close(layer.running_var, torch.tensor([14.4], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_sum_mode_hand_checked(device):
    layer = SumBatchNorm(1, dims=1, combine="sum", momentum=1.0, affine=False).to(device)
    x = hand_batch(device)
    with client_split(layer, [2, 4]):
        y = layer(x)
    # union [0, 2, 4, 6, 8, 10]: mean 5, biased variance 70/6, unbiased 14
    torch.testing.assert_close(y, (x - 5.0) / np.sqrt(70.0 / 6.0 + layer.eps))
    torch.testing.assert_close(layer.running_mean, torch.tensor([5.0], device=device))
    torch.testing.assert_close(layer.running_var, torch.tensor([14.0], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_client_mean_with_equal_shares_is_batchnorm2d_on_the_union(device):
    # two clients with 4 images each and different data (a label mix shifts one of them):
    # FedTAN's statistics are BatchNorm's on the union — outputs, gradients, running stats
    mean_mode, reference = make_pair(2, 4, device, combine="client-mean", momentum=0.3)
    x, grad = batch((BATCH, 4, 3, 3), device, 0)
    x[4:] += 5.0
    x[4:, 1] *= 3.0
    x_ours, x_ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with client_split(mean_mode, [4, 4]):
        y = mean_mode(x_ours)
    y_ref = reference(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    (y * grad).sum().backward()
    (y_ref * grad).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mean_mode.weight.grad, reference.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mean_mode.running_mean, reference.running_mean)
    torch.testing.assert_close(mean_mode.running_var, reference.running_var)


@pytest.mark.parametrize("device", DEVICES)
def test_client_mean_differs_from_batchnorm_for_unequal_shares(device):
    mean_mode, reference = make_pair(2, 4, device, combine="client-mean")
    x, _ = batch((BATCH, 4, 3, 3), device, 0)
    x[:2] += 4.0
    with client_split(mean_mode, [2, 6]):
        y = mean_mode(x)
    assert (y - reference(x)).abs().max() > 0.1


def test_combine_statistics_hand_computed():
    # channel 0: client A [0, 2], client B [4, 6, 8, 10]; channel 1: A [1, 1], B [3, 3, 3, 7]
    sums = torch.tensor([[2.0, 2.0], [28.0, 16.0]], dtype=torch.float64)
    sq_sums = torch.tensor([[4.0, 2.0], [216.0, 76.0]], dtype=torch.float64)
    counts = [2, 4]
    mean, var = combine_statistics(sums, sq_sums, counts, "sum")
    torch.testing.assert_close(mean, torch.tensor([5.0, 3.0], dtype=torch.float64))
    torch.testing.assert_close(var, torch.tensor([70.0 / 6.0, 4.0], dtype=torch.float64))
    mean, var = combine_statistics(sums, sq_sums, torch.tensor(counts), "client-mean")
    # channel 0: means 1 and 7 -> 4; variances around 4: (16 + 4)/2 = 10 and
    # (0 + 4 + 16 + 36)/4 = 14 -> 12. Channel 1: means 1 and 4 -> 2.5; around 2.5:
    # 2.25 and (3 · 0.25 + 20.25)/4 = 5.25 -> 3.75
    torch.testing.assert_close(mean, torch.tensor([4.0, 2.5], dtype=torch.float64))
    torch.testing.assert_close(var, torch.tensor([12.0, 3.75], dtype=torch.float64))
    with pytest.raises(ValueError, match="combine mode"):
        combine_statistics(sums, sq_sums, counts, "median")


def test_combine_statistics_weights_by_counts_and_never_returns_negative_variance():
    # the same per-client means with different counts move the union mean, not the FedTAN mean
    sums = torch.tensor([[1.0], [30.0]])
    sq_sums = torch.tensor([[1.0], [90.0]])
    union_mean, _ = combine_statistics(sums, sq_sums, [1, 10], "sum")
    torch.testing.assert_close(union_mean, torch.tensor([31.0 / 11.0]))
    client_mean, _ = combine_statistics(sums, sq_sums, [1, 10], "client-mean")
    torch.testing.assert_close(client_mean, torch.tensor([2.0]))
    _, var = combine_statistics(torch.tensor([[3.0]]), torch.tensor([[2.9999]]), [3], "sum")
    assert float(var) == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combine", ["sum", "client-mean"])
def test_layer_combines_per_client_partial_sums(monkeypatch, device, combine):
    calls = []

    def spy(sums, sq_sums, counts, mode):
        calls.append((sums.clone(), sq_sums.clone(), counts.clone(), mode))
        return combine_statistics(sums, sq_sums, counts, mode)

    monkeypatch.setattr(norm_module, "combine_statistics", spy)
    layer = SumBatchNorm(4, dims=2, combine=combine).to(device)
    x, grad_output = batch((BATCH, 4, 3, 3), device, 0)
    split = [1, 4, 3]
    step(layer, x, grad_output, split)
    ((sums, sq_sums, counts, mode),) = calls
    assert mode == combine
    torch.testing.assert_close(counts.cpu(), torch.tensor([9.0, 36.0, 27.0], dtype=counts.dtype))
    # the layer may sum shifted values x − k; whatever per-channel k it used, the partial
    # sums must be those of each client's own samples
    raw = [part.double().transpose(0, 1).reshape(4, -1) for part in x.split(split)]
    raw_sums = torch.stack([values.sum(1) for values in raw])
    raw_sq_sums = torch.stack([values.square().sum(1) for values in raw])
    counts = counts.to(raw_sums)[:, None]
    shift = (raw_sums[0] - sums[0].to(raw_sums)) / counts[0]
    torch.testing.assert_close(sums.to(raw_sums), raw_sums - counts * shift, atol=1e-4, rtol=1e-5)
    expected_sq = raw_sq_sums - 2 * shift * raw_sums + counts * shift.square()
    torch.testing.assert_close(sq_sums.to(raw_sums), expected_sq, atol=1e-3, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combine", ["sum", "client-mean"])
@pytest.mark.parametrize("split", [[6], [1, 2, 3], [4, 2]])
def test_gradcheck_float64(device, combine, split):
    layer = SumBatchNorm(3, dims=2, combine=combine, track_running_stats=False)
    layer = layer.double().to(device)
    layer.native_single_client = False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, 2, 2, generator=generator, dtype=torch.float64) + 1.0
    x[:1] += 2.0  # unequal client means make client-mean differ from the exact statistics
    x = x.to(device).requires_grad_(True)
    weight = torch.rand(3, generator=generator, dtype=torch.float64).add(0.5).to(device)
    bias = torch.randn(3, generator=generator, dtype=torch.float64).to(device)
    weight.requires_grad_(True)
    bias.requires_grad_(True)

    def forward(x, weight, bias):
        with client_split(layer, split):
            return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (x,))

    assert torch.autograd.gradcheck(forward, (x, weight, bias))


@pytest.mark.parametrize("device", DEVICES)
def test_sum_backward_equals_autograd_of_the_plain_forward(device):
    # the hand-written backward against autograd through the same forward in plain ops
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, 5, generator=generator, dtype=torch.float64).to(device)
    weight = torch.rand(3, generator=generator, dtype=torch.float64).to(device)
    bias = torch.randn(3, generator=generator, dtype=torch.float64).to(device)
    grad_output = torch.randn(7, 3, 5, generator=generator, dtype=torch.float64).to(device)
    membership, counts = norm_module._segment_tensors((2, 1, 4), x.device, torch.float64)
    results = []
    for custom_backward in (True, False):
        inputs = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
        if custom_backward:
            y, _, _ = norm_module._SumBatchNormFunction.apply(*inputs, membership, counts, 1e-5)
        else:
            y, _, _ = norm_module._autograd_forward(*inputs, membership, counts, 1e-5, "sum")
        grads = torch.autograd.grad(y, inputs, grad_output)
        results.append((y, *grads))
    for custom, plain in zip(*results):
        torch.testing.assert_close(custom, plain)


@pytest.mark.parametrize("device", DEVICES)
def test_functorch_grad_and_vmap_work(device):
    layer = SumBatchNorm(3, dims=1, track_running_stats=False).to(device)
    params = dict(layer.named_parameters())
    x = torch.randn(4, 6, 3, device=device)

    def loss(params, x):
        with client_split(layer, [2, 4]):
            return torch.func.functional_call(layer, params, (x,)).pow(3).sum()

    batched = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for index in range(4):
        single = torch.func.grad(loss)(params, x[index])
        torch.testing.assert_close(batched["weight"][index], single["weight"])


def test_client_split_sets_every_layer_and_restores():
    model = nn.Sequential(nn.Linear(3, 4), SumBatchNorm1d(4), nn.ReLU(), SumBatchNorm1d(4))
    layers = [model[1], model[3]]
    with client_split(model, np.array([2, 3])):
        assert all(layer.client_sizes == (2, 3) for layer in layers)
        with client_split(model, [5]):
            assert all(layer.client_sizes == (5,) for layer in layers)
        assert all(layer.client_sizes == (2, 3) for layer in layers)
        model(torch.randn(5, 3))
    assert all(layer.client_sizes is None for layer in layers)
    with pytest.raises(RuntimeError), client_split(model, [1, 4]):
        raise RuntimeError("boom")
    assert all(layer.client_sizes is None for layer in layers)


def test_bad_splits_and_inputs_are_rejected():
    layer = SumBatchNorm2d(4)
    with pytest.raises(ValueError, match="positive"):
        with client_split(layer, [2, 0]):
            pass
    with pytest.raises(ValueError, match="sum to 5"), client_split(layer, [2, 3]):
        layer(torch.randn(6, 4, 2, 2))
    with pytest.raises(ValueError, match="more than 1 value"):
        SumBatchNorm1d(4)(torch.randn(1, 4))
    with pytest.raises(ValueError, match="channels"):
        layer(torch.randn(6, 4, 2))
    with pytest.raises(ValueError, match="combine mode"):
        SumBatchNorm(4, combine="mean")


def test_state_dict_interchanges_with_batchnorm():
    reference = nn.BatchNorm2d(5)
    reference(torch.randn(4, 5, 2, 2))
    layer = SumBatchNorm2d(5)
    layer.load_state_dict(reference.state_dict())
    assert set(layer.state_dict()) == set(reference.state_dict())
    torch.testing.assert_close(layer.running_var, reference.running_var)
    reference.load_state_dict(layer.state_dict())

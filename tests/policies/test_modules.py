"""Shared building blocks: time features, image encoder, augmentation, value head, log-prob grouping."""

import math

import pytest
import torch

from embodrl.policies.modules.cnn import ImageEncoder, random_shift
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import ValueHead
from embodrl.policies.modules.time_features import time_features


def test_time_features_are_sin_cos_of_scaled_t():
    t = torch.tensor([0.0, 0.25, 1.0])
    feats = time_features(t, 3)
    assert feats.shape == (3, 6)
    assert feats[1, 0].item() == pytest.approx(math.sin(math.pi * 0.25))
    assert feats[1, 5].item() == pytest.approx(math.cos(4 * math.pi * 0.25))


@pytest.mark.parametrize("size", [(64, 64), (128, 96)])
def test_image_encoder_maps_uint8_images_to_features(size):
    enc = ImageEncoder(size, (32, 64, 64, 64), 128)
    images = torch.randint(0, 256, (2, *size, 3), dtype=torch.uint8)
    assert enc(images).shape == (2, 128)


def test_random_shift_translates_each_image_within_the_pad():
    torch.manual_seed(0)
    images = torch.zeros(8, 16, 16, 3, dtype=torch.uint8)
    images[:, 6:10, 6:10] = 255  # a centred square stays whole under shifts of at most 4 px
    shifted = random_shift(images, 4)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    assert (shifted == 255).sum() == (images == 255).sum()
    assert not torch.equal(shifted, images)


def test_value_head_outputs_one_value_per_row():
    assert ValueHead(5, (8, 8))(torch.randn(3, 5)).shape == (3,)


def test_reduce_logprob_sums_over_the_documented_axes():
    per_element = torch.randn(2, 3, 4)
    assert torch.equal(reduce_logprob(per_element, "token"), per_element)
    torch.testing.assert_close(reduce_logprob(per_element, "action"), per_element.sum(-1))
    torch.testing.assert_close(reduce_logprob(per_element, "chunk"), per_element.sum((1, 2)))

# Owner(s): ["module: nn"]
"""Port of pytorch's ``test/nn/test_pruning.py`` serialization tests (``test_pruning_serialization_model``,
``test_pruning_serialization_state_dict``): a pruned model and its state_dict, in every load mode."""

import torch
import torch.nn as nn
from torch.nn.utils import prune
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests, swap

from test.ports._instantiate import instantiate
from torch_serial_testing import SerializationRoundTripTestCase


class TestPruningSerialization(SerializationRoundTripTestCase, TestCase):
    class Net(nn.Module):  # pytorch's habit: a helper module nested in the test class
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(10, 10)
            self.last = nn.Linear(10, 1)

        def forward(self, x):
            return self.last(torch.relu(self.first(x)))

    # what the pruned Sequential's full-module checkpoint needs (the pruning method is a forward pre-hook)
    safe_globals = (nn.Sequential, nn.Linear, nn.ReLU, prune.L1Unstructured, set)

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)

    def _pruned(self, device):
        model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1)).to(device)
        prune.l1_unstructured(module=model[0], name="weight", amount=0.9)
        return model

    def test_pruning_serialization_model(self, device):
        model = self._pruned(device)
        new_model = self.round_trip(model)  # in this test's load mode; a predicted rejection ends it here
        self.assertTrue(hasattr(new_model[0], "weight_orig"))
        self.assertTrue(hasattr(new_model[0], "weight_mask"))
        self.assertFalse(hasattr(new_model[0], "weight_orig") and "weight" in new_model[0]._parameters)
        self.assertEqual(model[0].weight_mask, new_model[0].weight_mask)
        x = torch.randn(3, 10, device=device)
        self.assertEqual(model(x), new_model(x))

    @parametrize("amount", [0.3, 0.9])
    def test_pruning_serialization_state_dict(self, device, amount):
        model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1)).to(device)
        prune.l1_unstructured(module=model[0], name="weight", amount=amount)
        prune.remove(module=model[0], name="weight")  # the state_dict then holds plain weights
        self.assertNotIn("weight_orig", model.state_dict())
        state = self.round_trip(model.state_dict(), safe_globals=())
        new_model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1)).to(device)
        new_model.load_state_dict(state)
        x = torch.randn(3, 10, device=device)
        self.assertEqual(model(x), new_model(x))
        zeros = (new_model[0].weight == 0).sum().item()
        self.assertEqual(zeros, round(amount * 100))

    @swap([True, False])
    def test_nested_helper_state_dict(self, device):
        net = TestPruningSerialization.Net().to(device)
        state = self.round_trip(net.state_dict(), safe_globals=())
        fresh = TestPruningSerialization.Net().to(device)
        fresh.load_state_dict(state)  # under @swap(True) the parameters are swapped in, not copied
        x = torch.randn(3, 10, device=device)
        self.assertEqual(net(x), fresh(x))
        # pruned after loading, as upstream prunes a freshly built model
        prune.l1_unstructured(fresh.first, name="weight", amount=0.5)
        self.assertEqual(int((fresh.first.weight == 0).sum()), 50)


instantiate(TestPruningSerialization, globals())

if __name__ == "__main__":
    run_tests()

# Owner(s): ["module: optimizer", "module: LrScheduler"]
"""Port of pytorch's ``test/optim/test_lrscheduler.py`` state_dict tests (``_check_scheduler_state_dict``:
a scheduler's and its optimizer's state saved mid-schedule, loaded into fresh ones, which then step
identically), with the optimizers of ``@optims`` and the nested ``SchedulerTestNet`` upstream uses."""

import torch
from torch.optim import SGD, Adam
from torch.optim.lr_scheduler import ExponentialLR, MultiStepLR, StepLR
from torch.testing._internal.common_optimizers import optim_db, optims
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests

from test.ports._instantiate import instantiate
from torch_serial_testing import SerializationRoundTripTestCase

SCHEDULERS = {
    "step": lambda opt: StepLR(opt, step_size=3, gamma=0.5),
    "multistep": lambda opt: MultiStepLR(opt, milestones=[2, 5], gamma=0.1),
    "exponential": lambda opt: ExponentialLR(opt, gamma=0.9),
}


class TestLRSchedulerState(SerializationRoundTripTestCase, TestCase):
    class SchedulerTestNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 1, 1)
            self.conv2 = torch.nn.Conv2d(1, 1, 1)

        def forward(self, x):
            return self.conv2(torch.nn.functional.relu(self.conv1(x)))

    load_modes = ("weights_only_false", "safe_globals", "default")

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        self.net = TestLRSchedulerState.SchedulerTestNet()

    def _optimizer(self, optim_cls=SGD):
        return optim_cls(
            [{"params": self.net.conv1.parameters()}, {"params": self.net.conv2.parameters(), "lr": 0.5}], lr=0.05
        )

    def _step(self, optimizer, scheduler, steps):
        for _ in range(steps):
            optimizer.zero_grad()
            self.net(torch.ones(1, 1, 2, 2)).sum().backward()
            optimizer.step()
            scheduler.step()

    @parametrize("kind", list(SCHEDULERS))
    def test_scheduler_state_dict(self, device, kind):
        optimizer = self._optimizer()
        scheduler = SCHEDULERS[kind](optimizer)
        self._step(optimizer, scheduler, 4)
        state = self.round_trip(scheduler.state_dict(), safe_globals=())  # plain containers and numbers
        fresh = SCHEDULERS[kind](self._optimizer())
        fresh.load_state_dict(state)
        self.assertEqual(
            {k: v for k, v in scheduler.__dict__.items() if k != "optimizer"},
            {k: v for k, v in fresh.__dict__.items() if k != "optimizer"},
        )
        self.assertEqual(scheduler.get_last_lr(), fresh.get_last_lr())

    @optims([o for o in optim_db if o.optim_cls in (SGD, Adam)], dtypes=[torch.float32])
    def test_optimizer_and_scheduler_resume(self, device, dtype, optim_info):
        optimizer = self._optimizer(optim_info.optim_cls)
        scheduler = StepLR(optimizer, step_size=2, gamma=0.5)
        self._step(optimizer, scheduler, 3)
        saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        loaded = self.round_trip(saved, safe_globals=())
        self.assertRoundTripEqual(saved, loaded)
        net_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        resumed_opt = self._optimizer(optim_info.optim_cls)
        resumed_opt.load_state_dict(loaded["optimizer"])
        resumed = StepLR(resumed_opt, step_size=2, gamma=0.5)
        resumed.load_state_dict(loaded["scheduler"])
        self._step(optimizer, scheduler, 2)
        expected = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.net.load_state_dict(net_state)
        self._step(resumed_opt, resumed, 2)
        self.assertEqual(expected, self.net.state_dict())
        self.assertEqual(scheduler.get_last_lr(), resumed.get_last_lr())


instantiate(TestLRSchedulerState, globals())

if __name__ == "__main__":
    run_tests()

"""A trained model ships: SyncBatchNorm layers that normalize with the
running statistics (eval, freeze, use_global_stats) run torch's ops, so
torch.jit.trace, torch.jit.script and torch.onnx.export give eager's outputs
with the buffers as buffers (not constants baked in). Each against torch's
BatchNorm in float64 on the same batch. No service is needed."""

import io
import unittest
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F

import harness
import syncnorm.torch as snt

TOLERANCE = 1e-5


def randomize(model, seed):
    """Fresh random parameters and running statistics (never the
    defaults, which would hide a buffer read as a constant)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, snt.SyncBatchNorm):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g))
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.randn(c, generator=g))
                m.bias.copy_(torch.randn(c, generator=g))
                m.num_batches_tracked.fill_(7)
    return model


def reference(bn, x, z=None):
    """torch's BatchNorm in float64 with bn's parameters and buffers."""
    xc = x.double()
    if bn.channel_last and x.dim() > 2:
        xc = xc.movedim(-1, 1)
    y = F.batch_norm(xc, bn.running_mean.double(), bn.running_var.double(),
                     bn.weight.double(), bn.bias.double(), False, 0.0, bn.eps)
    if bn.channel_last and x.dim() > 2:
        y = y.movedim(1, -1)
    if z is not None:
        y = y + z.double()
    return F.relu(y) if bn.fuse_relu else y


def run_onnx(data, feeds):
    """Evaluates an exported graph in numpy: the operators a batch norm
    layer exports to (and nothing else, so an unexpected graph fails)."""
    model = onnx.load_from_string(data)
    env = {i.name: onnx.numpy_helper.to_array(i)
           for i in model.graph.initializer}
    env.update(feeds)
    for node in model.graph.node:
        a = {at.name: onnx.helper.get_attribute_value(at)
             for at in node.attribute}
        ins = [env[name] for name in node.input]
        op = node.op_type
        if op == "Identity":
            out = ins[0]
        elif op == "Transpose":
            out = np.transpose(ins[0], a["perm"])
        elif op == "Cast":
            out = ins[0].astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
        elif op == "Add":
            out = ins[0] + ins[1]
        elif op == "Relu":
            out = np.maximum(ins[0], 0)
        elif op == "BatchNormalization":
            x, scale, b, mean, var = (v.astype(np.float64) for v in ins)
            shape = (1, -1) + (1,) * (x.ndim - 2)
            out = ((x - mean.reshape(shape)) /
                   np.sqrt(var.reshape(shape) + a["epsilon"]) *
                   scale.reshape(shape) + b.reshape(shape))
        else:
            raise AssertionError("unexpected ONNX operator %s" % op)
        env[node.output[0]] = out
    return env[model.graph.output[0].name], env


class ExportTest(unittest.TestCase):

    def cases(self):
        """(name, layer, inputs): eval in 2-D, 4-D and channel_last with
        fuse_relu and z, freeze and use_global_stats in training mode."""
        torch.manual_seed(33)
        x4 = torch.randn(3, 4, 5, 5) * 2 + 1
        xl = torch.randn(3, 5, 5, 4) * 2 + 1
        return [
            ("eval 4-D", randomize(snt.SyncBatchNorm(4), 1).eval(), (x4,)),
            ("eval 2-D", randomize(snt.SyncBatchNorm(4), 2).eval(),
             (torch.randn(6, 4) - 1,)),
            ("eval channel_last fuse_relu z",
             randomize(snt.SyncBatchNorm(4, channel_last=True,
                                         fuse_relu=True), 3).eval(),
             (xl, torch.randn_like(xl))),
            ("freeze", randomize(snt.SyncBatchNorm(4, freeze=True), 4).train(),
             (x4,)),
            ("use_global_stats",
             randomize(snt.SyncBatchNorm(4, use_global_stats=True), 5).train(),
             (x4,)),
        ]

    def test_eager_is_torch_batch_norm(self):
        for name, bn, args in self.cases():
            with self.subTest(name):
                self.assertLess(harness.rel_error(bn(*args),
                                                  reference(bn, *args)),
                                TOLERANCE)

    def test_trace_without_warnings_and_with_buffers(self):
        for name, bn, args in self.cases():
            with self.subTest(name):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    traced = torch.jit.trace(bn, args)
                self.assertEqual([str(w.message) for w in caught], [])
                fresh = tuple(torch.randn_like(a) for a in args)
                self.assertLess(harness.rel_error(traced(*fresh),
                                                  reference(bn, *fresh)),
                                TOLERANCE)
                buffers = dict(traced.named_buffers())
                self.assertEqual(sorted(buffers), [
                    "num_batches_tracked", "running_mean", "running_var"])
                # The trace reads its buffers: new statistics, new output.
                with torch.no_grad():
                    buffers["running_mean"].add_(0.5)
                    buffers["running_var"].mul_(2.0)
                self.assertLess(harness.rel_error(traced(*fresh),
                                                  reference(bn, *fresh)),
                                TOLERANCE)

    def test_script_gives_eager_outputs(self):
        for name, bn, args in self.cases():
            with self.subTest(name):
                scripted = torch.jit.script(bn)
                self.assertLess(harness.rel_error(scripted(*args),
                                                  reference(bn, *args)),
                                TOLERANCE)
                self.assertEqual(
                    sorted(dict(scripted.named_buffers())),
                    ["num_batches_tracked", "running_mean", "running_var"])

    def test_script_of_a_training_layer_refuses_to_train(self):
        scripted = torch.jit.script(snt.SyncBatchNorm(4).train())
        with self.assertRaisesRegex(Exception, "running statistics only"):
            scripted(torch.randn(3, 4))
        scripted.eval()
        self.assertEqual(tuple(scripted(torch.randn(3, 4)).shape), (3, 4))

    def test_onnx_export_gives_eager_outputs(self):
        for name, bn, args in self.cases():
            with self.subTest(name):
                f = io.BytesIO()
                names = ["x", "z"][:len(args)]
                torch.onnx.export(bn, args, f, input_names=names,
                                  do_constant_folding=False)
                got, env = run_onnx(f.getvalue(), {
                    n: a.numpy() for n, a in zip(names, args)})
                self.assertLess(harness.rel_error(torch.tensor(got),
                                                  reference(bn, *args)),
                                TOLERANCE)
                for buf in (bn.running_mean, bn.running_var):
                    self.assertTrue(any(
                        v.shape == buf.shape and
                        np.array_equal(v, buf.numpy()) for v in env.values()))

    def test_converted_model_traces_scripts_and_exports(self):
        """A converted Conv-BN-ReLU model in eval: trace and script give
        eager's outputs, and the export is torch's BatchNorm model's (which
        folds the statistics into the convolution)."""
        torch.manual_seed(7)
        plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                              nn.ReLU())
        model = randomize(snt.convert_sync_batchnorm(plain), 8).eval()
        plain.load_state_dict(model.state_dict())
        plain.eval()
        bn = model[1]
        x = torch.randn(2, 3, 7, 7)
        want = F.relu(reference(bn, model[0](x).detach()))
        self.assertLess(harness.rel_error(model(x), want), TOLERANCE)
        self.assertLess(harness.rel_error(torch.jit.trace(model, x)(x), want),
                        TOLERANCE)
        self.assertLess(harness.rel_error(torch.jit.script(model)(x), want),
                        TOLERANCE)
        graphs = []
        for m in (model, plain):
            f = io.BytesIO()
            torch.onnx.export(m, (x,), f)
            graph = onnx.load_from_string(f.getvalue()).graph
            graphs.append(([n.op_type for n in graph.node], [
                onnx.numpy_helper.to_array(i) for i in graph.initializer]))
        self.assertEqual(graphs[0][0], graphs[1][0])
        self.assertEqual(len(graphs[0][1]), len(graphs[1][1]))
        for got, want in zip(graphs[0][1], graphs[1][1]):
            self.assertLess(harness.rel_error(torch.tensor(got),
                                              torch.tensor(want)), 1e-6)

if __name__ == "__main__":
    unittest.main()

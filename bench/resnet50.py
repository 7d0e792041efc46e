"""The 53 BatchNorm layers of torchvision's ResNet-50 at 224x224, in forward
order, as (name, channels, spatial). Mirrors bench/resnet50_layers.h."""


def bn_layers():
    layers = [("bn1", 64, 112)]
    for s, (blocks, width, size) in enumerate(
            zip([3, 4, 6, 3], [64, 128, 256, 512], [56, 28, 14, 7])):
        prev = [56, 56, 28, 14][s]
        for b in range(blocks):
            p = "layer%d.%d." % (s + 1, b)
            # torchvision v1.5: the stride is on conv2, so a stage's first
            # bn1 still sees the previous map size.
            layers.append((p + "bn1", width, prev if b == 0 else size))
            layers.append((p + "bn2", width, size))
            layers.append((p + "bn3", width * 4, size))
            if b == 0:
                layers.append((p + "downsample.1", width * 4, size))
    assert len(layers) == 53
    return layers

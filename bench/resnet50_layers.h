// The 53 BatchNorm layers of torchvision's ResNet-50 (224x224 input), in
// forward order, derived from the architecture: a 64-channel stem at 112x112,
// then stages of [3, 4, 6, 3] bottlenecks of widths 64/128/256/512 (expansion
// 4) at 56/28/14/7, with a downsample BN in each stage's first block.
#ifndef SYNCNORM_BENCH_RESNET50_LAYERS_H_
#define SYNCNORM_BENCH_RESNET50_LAYERS_H_

#include <string>
#include <vector>

namespace syncnorm::bench {

struct BnLayer {
  std::string name;
  int channels = 0;
  int spatial = 0;  // H = W of the BN's input
};

inline std::vector<BnLayer> ResNet50BnLayers() {
  std::vector<BnLayer> layers = {{"bn1", 64, 112}};
  const int blocks[] = {3, 4, 6, 3};
  const int widths[] = {64, 128, 256, 512};
  const int sizes[] = {56, 28, 14, 7};
  for (int s = 0; s < 4; ++s) {
    for (int b = 0; b < blocks[s]; ++b) {
      const std::string p =
          "layer" + std::to_string(s + 1) + "." + std::to_string(b) + ".";
      // torchvision v1.5: the stride sits on conv2, so bn1 of a stage's
      // first block still sees the previous stage's map size.
      const int in_size = (b == 0 && s > 0) ? sizes[s - 1] : sizes[s];
      layers.push_back({p + "bn1", widths[s], in_size});
      layers.push_back({p + "bn2", widths[s], sizes[s]});
      layers.push_back({p + "bn3", widths[s] * 4, sizes[s]});
      if (b == 0)
        layers.push_back({p + "downsample.1", widths[s] * 4, sizes[s]});
    }
  }
  return layers;
}

}  // namespace syncnorm::bench

#endif  // SYNCNORM_BENCH_RESNET50_LAYERS_H_

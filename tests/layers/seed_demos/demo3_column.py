import torch
from tpviz.layers import ColumnParallelLinear

# 磁盘整份 weight[out=4, in=3]，第 r 行全填常数 r，便于辨认是哪一行
W_full = torch.arange(4.).reshape(4, 1).repeat(1, 3)
print("磁盘整份 W行号:", W_full[:, 0].tolist())          # [0., 1., 2., 3.]

# tp=2：每卡 weight 已缩成 [out/tp, in] = [2, 3]
c0 = ColumnParallelLinear(3, 4, tp_size=2, tp_rank=0)
c1 = ColumnParallelLinear(3, 4, tp_size=2, tp_rank=1)
print("每卡 weight 形状:", tuple(c0.weight.shape), " tp_dim =", c0.tp_dim)

c0.weight_loader(c0.weight, W_full)
c1.weight_loader(c1.weight, W_full)
print("rank0 拿到行:", c0.weight[:, 0].tolist())       # [0., 1.]
print("rank1 拿到行:", c1.weight[:, 0].tolist())       # [2., 3.]

x = torch.randn(5, 3)                                  # 输入完整
print("rank0 输出分片:", tuple(c0(x).shape))            # (5, 2)

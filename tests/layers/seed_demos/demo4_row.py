import torch
import torch.nn.functional as F
from tpviz.layers import RowParallelLinear

# 磁盘整份：weight[out=2, in=4]、bias[2]
W_full = torch.tensor([[1., 2, 3, 4], [5., 6, 7, 8]])
b_full = torch.tensor([10., 20.])

r0 = RowParallelLinear(4, 2, tp_size=2, tp_rank=0, bias=True)
r1 = RowParallelLinear(4, 2, tp_size=2, tp_rank=1, bias=True)
for r in (r0, r1):
    r.weight_loader(r.weight, W_full)   # 沿 dim=1 切列
    r.weight_loader(r.bias, b_full)     # 一维：整份拷

print("每卡 weight 形状:", tuple(r0.weight.shape))       # (2, 2) = [out, in/tp]
print("rank0 列段:", r0.weight.tolist())                 # 前 2 列
print("rank1 列段:", r1.weight.tolist())                 # 后 2 列
print("bias 两卡各一整份:", r0.bias.tolist(), r1.bias.tolist())

# forward：输入 x 也按输入维切两段
x = torch.tensor([[1., 1, 1, 1]])
y0 = r0(x[:, :2])    # rank0，含 bias
y1 = r1(x[:, 2:])    # rank1，不含 bias
print("rank0 部分和(含bias):", y0.tolist())              # [[13., 31.]]
print("rank1 部分和(无bias):", y1.tolist())              # [[7., 15.]]
print("all_reduce 求和:", (y0 + y1).tolist())            # [[20., 46.]]
print("单卡对照:", F.linear(x, W_full, b_full).tolist())  # [[20., 46.]]

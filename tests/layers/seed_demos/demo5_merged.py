import torch
from tpviz.layers import MergedColumnParallelLinear, QKVParallelLinear

# 合成磁盘整份：q 4 头、k/v 各 2 头，head_size=2，hidden=3
# 第 h 个头的两行都填一个头号常数（q:0~3、k:10~11、v:20~21），便于辨认
def by_head(num_heads, base, head_size=2, hidden=3):
    rows = [[float(base + h)] * hidden for h in range(num_heads) for _ in range(head_size)]
    return torch.tensor(rows)

q_full, k_full, v_full = by_head(4, 0), by_head(2, 10), by_head(2, 20)

qkv0 = QKVParallelLinear(3, 2, total_num_heads=4, total_num_kv_heads=2, tp_size=2, tp_rank=0)
qkv1 = QKVParallelLinear(3, 2, total_num_heads=4, total_num_kv_heads=2, tp_size=2, tp_rank=1)
for qkv in (qkv0, qkv1):
    qkv.weight_loader(qkv.weight, q_full, "q")
    qkv.weight_loader(qkv.weight, k_full, "k")
    qkv.weight_loader(qkv.weight, v_full, "v")

# 每卡合并 param：[8,3]，q 段[0:4]、k 段[4:6]、v 段[6:8]；读第 0 列的头号
a, b = qkv0.weight[:, 0], qkv1.weight[:, 0]
print("rank0 q头", a[0:4].tolist(), " k头", a[4:6].tolist(), " v头", a[6:8].tolist())
print("rank1 q头", b[0:4].tolist(), " k头", b[4:6].tolist(), " v头", b[6:8].tolist())

# gate/up：两段等大，双重切同理（intermediate=4、hidden=3）
m0 = MergedColumnParallelLinear(3, [4, 4], tp_size=2, tp_rank=0)
m0.weight_loader(m0.weight, torch.full((4, 3), 1.), 0)   # gate → 段[0:2]
m0.weight_loader(m0.weight, torch.full((4, 3), 2.), 1)   # up   → 段[2:4]
print("gate/up rank0 gate段", m0.weight[:2, 0].tolist(), " up段", m0.weight[2:4, 0].tolist())

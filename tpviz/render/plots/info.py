"""Each figure's title and one-line explanation, per matrix family (and the variants a model picks)."""

# (title, one-line explanation) per family; the explanation is shown in the app and as the figure subtitle
FAMILY_INFO = {
    "qkv": ("q / k / v projections · column-parallel",
            "Each GPU takes whole heads: its q, k and v rows are packed as [q | k | v] "
            "in its local qkv_proj."),
    "o_proj": ("o_proj · row-parallel",
               "Each GPU takes the input columns of its own heads; an all-reduce sums the partial outputs."),
    "gate_up": ("gate / up projections · merged column-parallel",
                "gate and up are each split by rows, then packed as [gate | up] in each GPU's gate_up_proj."),
    "down_proj": ("down_proj · row-parallel",
                  "Each GPU takes the columns matching its gate/up rows; an all-reduce sums the outputs."),
    "linear_attn": ("Gated DeltaNet (linear attention) · split by key-head groups",
                    "in_proj_qkvz / in_proj_ba are stored per key-head group, so each GPU takes "
                    "whole groups; conv1d takes its chunk of q, k and v; A_log and dt_bias "
                    "follow the value heads; out_proj is row-parallel."),
    "mamba": ("Mamba2 · split by heads (and groups)",
              "in_proj = [z | x | B | C | dt] and conv1d = [x | B | C] are cut part by part; "
              "with one group, B and C are replicated to every GPU; A_log, D, dt_bias and the gated "
              "norm follow the heads; out_proj is row-parallel."),
    "mamba1": ("Mamba1 · split by inner channels",
               "in_proj = [x | gate], conv1d, dt_proj, A (from A_log) and D follow each GPU's channels; "
               "x_proj is row-parallel, so dt, B and C are all-reduced; the dt / B / C norms are whole on "
               "every GPU; out_proj is row-parallel."),
    "conv": ("Short convolution · column then row",
             "in_proj = [B | C | x] is a merged column-parallel table, the depthwise conv "
             "follows the channels, out_proj is row-parallel."),
    "kda": ("Kimi Delta Attention · split by heads",
            "q, k, v and b (in_proj_qkvgfab), the float32 conv1d, f_b_proj, g_b_proj, A_log and dt_bias "
            "follow the heads; f_a_proj and g_a_proj (the gates' low-rank inputs) and o_norm are whole on "
            "every GPU; o_proj is row-parallel."),
    "experts": ("MoE experts · gate/up column-parallel, down row-parallel",
                "Every expert is split like a dense MLP over moe_intermediate_size: each GPU holds a "
                "slice of all experts."),
    "vision": ("Vision tower · attention and MLP column- then row-parallel, over the vision heads",
               "Each GPU takes whole vision heads of q/k/v and the matching columns of their output "
               "projection; the MLP (and a merger, where the tower has one) is cut like a dense MLP. The "
               "patch embedding, norms and a projector weight are whole on every GPU."),
    "vision_data": ("Vision tower · whole on every GPU (--mm-encoder-tp-mode data)",
                    "Every GPU holds the whole tower and its projector and encodes its own share of the "
                    "images: nothing is cut and the vision heads limit no tp."),
    "audio_split": ("Audio tower · attention and MLP column- then row-parallel, over the audio heads",
                    "Where tp divides the audio heads each GPU takes whole heads of q/k/v and the matching "
                    "columns of out_proj, and fc1 / fc2 are cut like a dense MLP; where it does not, vLLM "
                    "builds them whole on every GPU (disable_tp). Convolutions, norms and projections are "
                    "whole."),
    "audio": ("Audio tower · whole on every GPU",
              "The audio encoder and its projector are plain torch layers in vLLM (transformers' own "
              "modules), so every GPU holds all of them, whatever tp: nothing is cut and no tp is refused "
              "for them."),
    "vision_hf": ("Vision tower · whole on every GPU (transformers' own modules)",
                  "vLLM builds this tower with transformers' AutoModel (every nn.Linear a ReplicatedLinear): "
                  "every GPU holds all of it and its embedder, whatever tp or --mm-encoder-tp-mode; nothing "
                  "is cut and no tp is refused for it."),
    "audio_embedder": ("Audio tower's embedder · vocab-parallel table, row-parallel projection",
                       "The encoder itself is transformers' own modules, whole on every GPU (drawn in the "
                       "replicated tab); embed_audio's table is cut by vocabulary rows and its projection by "
                       "input columns, each GPU cutting the full-width input itself."),
    "embed": ("embed_tokens · vocab-parallel",
              "Each GPU holds a block of vocabulary rows; lookups outside it give "
              "zeros, then an all-reduce."),
    "lm_head": ("lm_head · vocab-parallel",
                "Each GPU computes the logits of its vocabulary block; vLLM gathers them to every "
                "GPU, nano-vllm to GPU 0."),
    "replicated": ("Replicated: norms, routers, latents and row-parallel biases",
                   "Every GPU holds a full copy; a row-parallel bias is added on GPU 0 only."),
}
# GLM-4 on vLLM's Transformers backend (Arch.mlp_gather): one column split of gate | up, gathered
GATHERED_INFO = {
    "gate_up": ("gate / up projection · column-parallel, gathered",
                "gate_up_proj is one ColumnParallelLinear: each GPU takes a contiguous block of its "
                "[gate | up] rows, not part of each, and an all-gather gives every GPU the whole output "
                "before down_proj."),
    "down_proj": ("down_proj · row-parallel over the gathered input",
                  "Every GPU computes act(gate) × up from the gathered rows, then takes its own block of "
                  "down_proj's input columns; an all-reduce sums the outputs."),
}
MLA_LINE = ("MLA: the per-head up-projections q_b_proj and kv_b_proj are split by heads; the latent "
            "down-projections are replicated (see the replicated figure).")

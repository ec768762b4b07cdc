"""LLM inference as users run it, on a model built from its config with seeded random weights
(no weights can be downloaded on the GPU machine): a decoder-only model of about 0.85 B
parameters in bf16.

  - greedy `generate` with a static KV cache under torch.compile(mode="reduce-overhead")
    (CUDA graphs), six times: the first compiles (and warms Inductor's cache), the median of the
    other five is timed;
  - batched prefill with scaled-dot-product attention (8 prompts of 512 tokens);
  - sentence-transformers `encode` of a batch, on a BERT-style encoder built the same way.

Prints what must be identical natively and through ivcuda (the tokens, rounded checksums of the
logits and embeddings) and `TIME` (the median decode) for run_frameworks.sh; the decode rate as
`FIG decode_tokens_per_s` (a figure, not compared).
  LLM_SERVE_PARTS=generate,prefill,encode   which parts (default all)
"""
import os
import time

import torch

PARTS = os.environ.get("LLM_SERVE_PARTS", "generate,prefill,encode").split(",")
torch.backends.cuda.matmul.allow_tf32 = False


def decoder():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(dtype=torch.bfloat16).eval()
    return model


def generate(model):
    prompt = torch.randint(0, 32000, (1, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    from transformers import CompileConfig

    # A static cache makes generate compile its decoding step itself (CUDA graphs with
    # reduce-overhead, CompileConfig's default, named here): compiling model.forward by hand as
    # well makes the cache's in-place update read a graph output the next replay overwrote.
    kw = dict(max_new_tokens=64, do_sample=False, cache_implementation="static",
              compile_config=CompileConfig(mode="reduce-overhead"))
    with torch.no_grad():
        first = model.generate(prompt, **kw)  # compiles; captures the graphs
        torch.cuda.synchronize()
        times, outs = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            outs.append(model.generate(prompt, **kw))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    new = outs[0][0, prompt.shape[1]:].tolist()
    print("generate tokens", new)
    print("generate repeatable", all(first.tolist() == o.tolist() for o in outs))
    print("generate compiled", torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0)
    print(f"FIG decode_tokens_per_s {len(new) / dt:.1f}")
    return dt


def prefill(model):
    batch = torch.randint(0, 32000, (8, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.no_grad(), torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION,
                                                          torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
        logits = model(batch).logits.float()
    torch.cuda.synchronize()
    print("prefill shape", tuple(logits.shape))
    print("prefill argmax of the last position", logits[:, -1].argmax(-1).tolist())
    print(f"prefill checksum {logits.abs().mean().item():.3f}")


def encode():
    """A BERT-style encoder saved as a plain Hugging Face model (random weights, a word-level
    tokenizer) and opened by sentence-transformers as users open one: mean pooling on top."""
    import tempfile

    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    torch.manual_seed(3)
    where = tempfile.mkdtemp(prefix="llm_serve_encoder.")
    cfg = BertConfig(vocab_size=30100, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512)
    BertModel(cfg).save_pretrained(where)
    vocab = {f"w{i}": i for i in range(30000)}
    vocab.update({"[UNK]": 30000, "[PAD]": 30001, "[CLS]": 30002, "[SEP]": 30003})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]").save_pretrained(where)
    st = SentenceTransformer(where, device="cuda")
    sentences = [" ".join(f"w{(7 * i + 3 * j) % 30000}" for j in range(5 + i % 40)) for i in range(256)]
    emb = st.encode(sentences, batch_size=64, convert_to_tensor=True)
    torch.cuda.synchronize()
    print("encode shape", tuple(emb.shape))
    print(f"encode checksum {emb.float().abs().mean().item():.4f}")


model = decoder() if ("generate" in PARTS or "prefill" in PARTS) else None
timed = None
if "prefill" in PARTS:
    prefill(model)
if "encode" in PARTS:
    encode()
if "generate" in PARTS:
    timed = generate(model)
if timed is not None:
    print(f"TIME {timed:.4f}")

"""Compiles FlashAttention-4's Hopper backward kernel without a GPU, for reading its SASS.

FA4 (flash-attn-4, the CuTe DSL) picks its sm90 backward configuration from the head dim and the
mask; this builds that kernel the way its interface does for bf16 and calls cute.compile on fake
tensors with symbolic shapes, so batch, heads and sequence length do not change the code. The
caller sets CUTE_DSL_ARCH=sm_90a, CUTE_DSL_KEEP=ptx,cubin and CUTE_DSL_DUMP_DIR (see
scripts/fa4_sass.sh); loading the kernel onto a device is never attempted.

usage: python3 bench/fa4_backward_compile.py HEAD_DIM [--causal]
"""
import argparse

import cutlass
import cutlass.cute as cute
from flash_attn.cute import interface
from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90
from flash_attn.cute.utils import AuxData


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("head_dim", type=int)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    d = args.head_dim
    config = interface._tile_size_bwd_sm90(d, d, args.causal, False)
    print("config:", config, flush=True)
    (q, k, v, _o, d_o, _dq, _dk, _dv, _lse, lse_log2, dpsum, dq_accum, _dk_accum, _dv_accum,
     _scale_p) = interface.make_fake_bwd_tensors(cutlass.BFloat16, has_gqa=False, varlen_q=False,
                                                 varlen_k=False)
    kernel = FlashAttentionBackwardSm90(
        cutlass.BFloat16, d, d, 1, args.causal, is_local=False, deterministic=False,
        tile_m=config.m_block_size, tile_n=config.n_block_size, Q_stage=config.num_stages_Q,
        dO_stage=config.num_stages_dO, PdS_stage=config.num_stages_PdS,
        SdP_swapAB=config.SdP_swapAB, dKV_swapAB=config.dKV_swapAB, dQ_swapAB=config.dQ_swapAB,
        AtomLayoutMSdP=config.AtomLayoutMSdP, AtomLayoutNdKV=config.AtomLayoutNdKV,
        AtomLayoutMdQ=config.AtomLayoutMdQ, num_threads=(config.num_wg + 1) * 128,
        V_in_regs=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
        has_aux_tensors=False, q_subtile_factor=1, dQ_single_wg=config.dQ_single_wg)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    # The positional arguments of the kernel's __call__ after dq_accum, dk and dv: the scale,
    # then the optional inputs (all absent here), the aux data and the stream.
    cute.compile(kernel, q, k, v, d_o, lse_log2, dpsum, dq_accum, _dk, _dv,
                 cutlass.Float32(1.0 / d**0.5), None, None, None, None, None, None, None, None,
                 None, AuxData(None, None), None, None, stream, options="--enable-tvm-ffi")
    print("compiled", flush=True)


if __name__ == "__main__":
    main()

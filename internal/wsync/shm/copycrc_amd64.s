//go:build amd64 && !purego

#include "textflag.h"

// func copyCRC3(dst, src *byte, part int, crcs *[3]uint32, nt bool)
//
// Copies 3·part bytes from src to dst (part a positive multiple of 64) as
// three streams of part bytes each, extending the raw CRC-32C state
// crcs[k] (no pre/post inversion) over stream k with the CRC32 instruction.
// The three CRC chains are interleaved so that the instruction's 3-cycle
// latency overlaps. Each 64-byte line is read once into the CRC and once
// into four XMM registers (the second read hits L1) and stored from those;
// with nt the stores are non-temporal (MOVNTDQ) and an SFENCE before
// returning orders them before every later store of this thread.
// LOADCRC loads the line at AX of each stream into X0–X11 and extends
// the three CRCs over it (a second read of the same line, from L1).
#define LOADCRC \
	MOVOU 0(SI)(AX*1), X0; \
	MOVOU 16(SI)(AX*1), X1; \
	MOVOU 32(SI)(AX*1), X2; \
	MOVOU 48(SI)(AX*1), X3; \
	MOVOU 0(R11)(AX*1), X4; \
	MOVOU 16(R11)(AX*1), X5; \
	MOVOU 32(R11)(AX*1), X6; \
	MOVOU 48(R11)(AX*1), X7; \
	MOVOU 0(R12)(AX*1), X8; \
	MOVOU 16(R12)(AX*1), X9; \
	MOVOU 32(R12)(AX*1), X10; \
	MOVOU 48(R12)(AX*1), X11; \
	CRC32Q 0(SI)(AX*1), R8; \
	CRC32Q 0(R11)(AX*1), R9; \
	CRC32Q 0(R12)(AX*1), R10; \
	CRC32Q 8(SI)(AX*1), R8; \
	CRC32Q 8(R11)(AX*1), R9; \
	CRC32Q 8(R12)(AX*1), R10; \
	CRC32Q 16(SI)(AX*1), R8; \
	CRC32Q 16(R11)(AX*1), R9; \
	CRC32Q 16(R12)(AX*1), R10; \
	CRC32Q 24(SI)(AX*1), R8; \
	CRC32Q 24(R11)(AX*1), R9; \
	CRC32Q 24(R12)(AX*1), R10; \
	CRC32Q 32(SI)(AX*1), R8; \
	CRC32Q 32(R11)(AX*1), R9; \
	CRC32Q 32(R12)(AX*1), R10; \
	CRC32Q 40(SI)(AX*1), R8; \
	CRC32Q 40(R11)(AX*1), R9; \
	CRC32Q 40(R12)(AX*1), R10; \
	CRC32Q 48(SI)(AX*1), R8; \
	CRC32Q 48(R11)(AX*1), R9; \
	CRC32Q 48(R12)(AX*1), R10; \
	CRC32Q 56(SI)(AX*1), R8; \
	CRC32Q 56(R11)(AX*1), R9; \
	CRC32Q 56(R12)(AX*1), R10

// STORE stores X0–X11, the line at AX of each stream, with op (MOVOU,
// or MOVNTO for non-temporal stores).
#define STORE(op) \
	op X0, 0(DI)(AX*1); \
	op X1, 16(DI)(AX*1); \
	op X2, 32(DI)(AX*1); \
	op X3, 48(DI)(AX*1); \
	op X4, 0(R13)(AX*1); \
	op X5, 16(R13)(AX*1); \
	op X6, 32(R13)(AX*1); \
	op X7, 48(R13)(AX*1); \
	op X8, 0(DX)(AX*1); \
	op X9, 16(DX)(AX*1); \
	op X10, 32(DX)(AX*1); \
	op X11, 48(DX)(AX*1)

TEXT ·copyCRC3(SB), NOSPLIT, $0-33
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ part+16(FP), CX
	MOVQ crcs+24(FP), BX
	MOVL 0(BX), R8
	MOVL 4(BX), R9
	MOVL 8(BX), R10
	LEAQ (SI)(CX*1), R11
	LEAQ (R11)(CX*1), R12
	LEAQ (DI)(CX*1), R13
	LEAQ (R13)(CX*1), DX
	XORQ AX, AX
	CMPB nt+32(FP), $0
	JNE ntloop

loop:
	LOADCRC
	STORE(MOVOU)
	ADDQ $64, AX
	CMPQ AX, CX
	JB loop
	JMP done

ntloop:
	LOADCRC
	STORE(MOVNTO)
	ADDQ $64, AX
	CMPQ AX, CX
	JB ntloop
	SFENCE

done:
	MOVL R8, 0(BX)
	MOVL R9, 4(BX)
	MOVL R10, 8(BX)
	RET

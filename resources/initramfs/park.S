/* SPDX-License-Identifier: Apache-2.0 */
/*
 * park: an init that keeps a guest kernel alive without doing any work.
 *
 * It makes no system call at all, not even exit: on a host where guest
 * user-to-kernel transitions are broken (PVM-backed KVM, see
 * shared/HOST-KVM.md) any system call kills init and with it the guest. The
 * vCPU spins here in user mode; timer interrupts still reach the kernel, so
 * softirqs and the network stack keep running. Boot with `rdinit=/park`.
 */
	.text
	.globl	_start
	.type	_start, @function
_start:
1:	pause
	jmp	1b
	.size	_start, . - _start

	/* No executable stack wanted. */
	.section .note.GNU-stack, "", @progbits

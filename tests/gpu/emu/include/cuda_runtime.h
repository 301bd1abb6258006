/* cuda_runtime.h -- empty on the emulator: cuda_emu.h (included first) defines it all */

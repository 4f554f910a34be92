//! The executable's own memory: reading its dynamic section (which
//! libraries' symbols it uses, which libc objects the linker copied into
//! it), and adopting its writable data (`.data`, `.bss`) into the DSM at
//! its own addresses, so the program's globals are shared without
//! annotations.
//!
//! # Copy relocations
//!
//! An executable that uses a data object of a shared library directly
//! (`stdout`, `environ`, `optind` …) gets its own copy of the object in
//! `.bss`, and the library uses that copy. Adopting `.bss` makes these
//! copies DSM memory holding process 0's values, which is right for
//! objects whose value is the same in every process (`stdout` points to
//! libc's `FILE`, at the same address everywhere since address-space
//! randomisation is off) and wrong for `environ`, which points to each
//! process's own environment on its own stack. Before adopting, every
//! process therefore copies its environment's pointer array to the same
//! address (a private mapping agreed on by all) and points `environ`
//! there: the shared value is then right everywhere. Every other copied
//! object must already agree; a start-up check names any that does not.

use core::ffi::{c_char, c_int, c_void};

use menps_dsm::com::Coll;
use menps_dsm::dsm::allocator::RuntimeGuard;

use menps_omp::Error;
use menps_omp::internals::ProgramDsm;

const PAGE: usize = 4096;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PF_W: u32 = 2;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_COPY: u32 = 5;
const PT_TLS: u32 = 7;

/// A symbol a relocation of the executable refers to.
#[derive(Debug, Clone)]
pub(crate) struct RelocSym {
    pub name: String,
    /// Where the relocation applies (absolute address).
    pub addr: usize,
    /// The symbol's size.
    pub size: usize,
    /// A copy relocation (the object lives in the executable).
    pub copy: bool,
}

/// What start-up needs to know about the executable.
#[derive(Debug, Default)]
pub(crate) struct Executable {
    /// Load bias.
    pub bias: usize,
    /// Address ranges of its loadable segments.
    pub segments: Vec<(usize, usize)>,
    /// The writable data to adopt (page-aligned), if any.
    pub data: Option<(usize, usize)>,
    /// Symbols its dynamic relocations refer to.
    pub relocs: Vec<RelocSym>,
    /// Bytes of its thread-local storage (`PT_TLS`), if it has any.
    pub tls: Option<usize>,
}

#[repr(C)]
struct Elf64Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

#[repr(C)]
struct Elf64Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

#[repr(C)]
struct Elf64Rela {
    r_offset: u64,
    r_info: u64,
    r_addend: i64,
}

unsafe extern "C" fn first_object(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    out: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid entry; `out` is the `Executable`
    // `read_executable` passed. The first entry is the executable.
    unsafe {
        let info = &*info;
        let exe = &mut *(out as *mut Executable);
        exe.bias = info.dlpi_addr as usize;
        let phdrs = core::slice::from_raw_parts(
            info.dlpi_phdr as *const Elf64Phdr,
            info.dlpi_phnum as usize,
        );
        let mut relro_end = 0usize;
        let mut dynamic = 0usize;
        let mut rw: Option<(usize, usize)> = None;
        for p in phdrs {
            let lo = exe.bias + p.p_vaddr as usize;
            let hi = lo + p.p_memsz as usize;
            match p.p_type {
                PT_LOAD => {
                    exe.segments.push((lo, hi));
                    if p.p_flags & PF_W != 0 {
                        rw = Some(match rw {
                            Some((a, b)) => (a.min(lo), b.max(hi)),
                            None => (lo, hi),
                        });
                    }
                }
                PT_GNU_RELRO => relro_end = relro_end.max(hi),
                PT_TLS if p.p_memsz > 0 => exe.tls = Some(p.p_memsz as usize),
                PT_DYNAMIC => dynamic = lo,
                _ => {}
            }
        }
        if let Some((lo, hi)) = rw {
            let start = (lo & !(PAGE - 1)).max(relro_end.next_multiple_of(PAGE));
            let end = hi.next_multiple_of(PAGE);
            if start < end {
                exe.data = Some((start, end - start));
            }
        }
        if dynamic != 0 {
            exe.relocs = read_relocs(exe.bias, dynamic as *const [i64; 2]);
        }
    }
    1
}

/// The relocations of the dynamic section at `dynamic`.
///
/// # Safety
///
/// `dynamic` is the executable's mapped dynamic section.
unsafe fn read_relocs(bias: usize, dynamic: *const [i64; 2]) -> Vec<RelocSym> {
    let (mut strtab, mut symtab, mut rela, mut relasz, mut jmprel, mut pltsz) = (0, 0, 0, 0, 0, 0);
    // The loader may have relocated the pointers in place already.
    let abs = |v: i64| {
        let v = v as usize;
        if v < bias { v + bias } else { v }
    };
    let mut d = dynamic;
    // SAFETY: the dynamic section ends with DT_NULL.
    unsafe {
        loop {
            let [tag, val] = *d;
            match tag {
                DT_NULL => break,
                DT_STRTAB => strtab = abs(val),
                DT_SYMTAB => symtab = abs(val),
                DT_RELA => rela = abs(val),
                DT_RELASZ => relasz = val as usize,
                DT_JMPREL => jmprel = abs(val),
                DT_PLTRELSZ => pltsz = val as usize,
                _ => {}
            }
            d = d.add(1);
        }
    }
    let mut out = Vec::new();
    if strtab == 0 || symtab == 0 {
        return out;
    }
    for (table, bytes) in [(rela, relasz), (jmprel, pltsz)] {
        if table == 0 {
            continue;
        }
        let n = bytes / size_of::<Elf64Rela>();
        // SAFETY: the relocation tables the dynamic section names.
        let relas = unsafe { core::slice::from_raw_parts(table as *const Elf64Rela, n) };
        for r in relas {
            let sym = (r.r_info >> 32) as usize;
            if sym == 0 {
                continue;
            }
            // SAFETY: a symbol index of the executable's symbol table, whose
            // name is a NUL-terminated string of its string table.
            let (name, size) = unsafe {
                let s = &*(symtab as *const Elf64Sym).add(sym);
                let name =
                    core::ffi::CStr::from_ptr((strtab + s.st_name as usize) as *const c_char);
                (name.to_string_lossy().into_owned(), s.st_size as usize)
            };
            out.push(RelocSym {
                name,
                addr: bias + r.r_offset as usize,
                size,
                copy: (r.r_info & 0xffff_ffff) as u32 == R_X86_64_COPY,
            });
        }
    }
    out
}

/// Reads the executable's program headers and dynamic relocations.
pub(crate) fn read_executable() -> Executable {
    let _rt = RuntimeGuard::enter();
    let mut exe = Executable::default();
    // SAFETY: `first_object` matches the callback's contract and stops at
    // the first entry.
    unsafe { libc::dl_iterate_phdr(Some(first_object), (&mut exe as *mut Executable).cast()) };
    exe
}

impl Executable {
    /// Whether `addr` lies in the executable's loaded image.
    pub(crate) fn contains(&self, addr: usize) -> bool {
        self.segments
            .iter()
            .any(|&(lo, hi)| (lo..hi).contains(&addr))
    }

    /// Whether the executable calls OpenMP's runtime (a reference to a
    /// `GOMP_` or `omp_` function).
    pub(crate) fn uses_openmp(&self) -> bool {
        self.relocs
            .iter()
            .any(|r| r.name.starts_with("GOMP_") || r.name.starts_with("omp_"))
    }
}

/// Collectively adopts the executable's writable data into the DSM
/// (several processes): fixes `environ`, checks the other copied objects,
/// adopts. Every process calls it.
pub(crate) fn adopt(dsm: &'static ProgramDsm) -> Result<(), Error> {
    let exe = read_executable();
    let here = adopt as *const () as usize;
    // Linked statically, this library's own state is among the program's
    // globals and cannot be shared.
    let linked_in = exe.contains(here);
    let verdict = agree(dsm, u64::from(linked_in))?;
    if verdict.iter().any(|&v| v != 0) {
        return Err(Error::Config(
            "the program is linked with the static libmenps_gomp.a, whose own state would be \
             shared with the program's globals: run across processes with the shared library \
             (link with -lmenps_gomp, or preload libmenps_gomp.so)"
                .into(),
        ));
    }
    fix_environ(dsm, &exe)?;
    check_copies(dsm, &exe)?;
    crate::atomics::install(&exe, crate::atomics::Patching::All)?;
    crate::symbols::install(exe.bias);
    let Some((start, len)) = exe.data else {
        return Ok(());
    };
    let _rt = RuntimeGuard::enter();
    dsm.adopt_range(start as *mut u8, len, PAGE)?;
    Ok(())
}

/// Every process's `v`, in rank order.
fn agree(dsm: &ProgramDsm, v: u64) -> Result<Vec<u64>, Error> {
    let _rt = RuntimeGuard::enter();
    let all = dsm.com().allgather(&v.to_le_bytes())?;
    Ok(all
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Points every process's `environ` to a copy of its own environment's
/// pointer array at one address, the same everywhere (see the module
/// documentation).
fn fix_environ(dsm: &ProgramDsm, exe: &Executable) -> Result<(), Error> {
    let env = exe
        .relocs
        .iter()
        .find(|r| r.copy && matches!(r.name.as_str(), "environ" | "__environ" | "_environ"));
    let Some(env) = env else { return Ok(()) };
    let var = env.addr as *mut *mut *mut c_char;
    // SAFETY: the executable's copy of `environ`, a valid pointer to a
    // NULL-terminated array.
    let (old, n) = unsafe {
        let old = *var;
        let mut n = 0;
        while !old.is_null() && !(*old.add(n)).is_null() {
            n += 1;
        }
        (old, n)
    };
    let need = ((n + 1) * 8).next_multiple_of(PAGE) as u64;
    let len = agree(dsm, need)?.into_iter().max().unwrap_or(PAGE as u64) as usize;
    // Process 0 picks the address, the others map the same.
    let mine = if dsm.rank() == 0 {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED { 0 } else { p as u64 }
    } else {
        0
    };
    let at = agree(dsm, mine)?[0] as usize;
    let ok = at != 0
        && (dsm.rank() == 0 || {
            // SAFETY: maps fresh memory at `at` only if nothing is there.
            let p = unsafe {
                libc::mmap(
                    at as *mut c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            p as usize == at
        });
    if agree(dsm, u64::from(ok))?.contains(&0) {
        return Err(Error::Config(format!(
            "cannot place the environment at one address in every process ({at:#x}, {len} bytes)"
        )));
    }
    // SAFETY: `at` is this process's fresh mapping of `len >= (n + 1) * 8`
    // bytes; `old` holds `n` pointers and a null.
    unsafe {
        core::ptr::copy_nonoverlapping(old, at as *mut *mut c_char, n + 1);
        *var = at as *mut *mut c_char;
    }
    Ok(())
}

/// Checks that the objects the linker copied into the executable hold the
/// same bytes in every process.
fn check_copies(dsm: &ProgramDsm, exe: &Executable) -> Result<(), Error> {
    let copies: Vec<&RelocSym> = exe.relocs.iter().filter(|r| r.copy).collect();
    let mut hashes = Vec::with_capacity(copies.len());
    for r in &copies {
        // SAFETY: a copied object of the executable: `size` readable bytes.
        let bytes = unsafe { core::slice::from_raw_parts(r.addr as *const u8, r.size) };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        hashes.push(h);
    }
    let all = {
        let _rt = RuntimeGuard::enter();
        let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        dsm.com().allgather(&bytes)?
    };
    let per = hashes.len() * 8;
    if per == 0 {
        return Ok(());
    }
    for (p, theirs) in all.chunks_exact(per).enumerate() {
        for (k, c) in theirs.chunks_exact(8).enumerate() {
            if c != hashes[k].to_le_bytes() {
                return Err(Error::Config(format!(
                    "the shared library object `{}` (copied into the executable) differs between \
                     processes 0 and {p}, so the program's globals cannot be shared (are the \
                     processes' libraries loaded at different addresses?)",
                    copies[k].name
                )));
            }
        }
    }
    Ok(())
}

//! The executable's data symbols, for race reports: a write-write race on
//! a global is reported with the variable's name (see
//! [`menps_dsm::dsm::race`]).

use std::sync::OnceLock;

use menps_dsm::dsm::allocator::RuntimeGuard;

/// A data object of the executable: absolute address, size, name.
struct Object {
    start: usize,
    size: usize,
    name: String,
}

static OBJECTS: OnceLock<Vec<Object>> = OnceLock::new();

/// Reads the executable's symbol table (`.symtab`, else nothing: a
/// stripped program's races name no symbol) and installs the symbolizer.
pub(crate) fn install(bias: usize) {
    let objects = {
        let _rt = RuntimeGuard::enter();
        let mut v = std::fs::read("/proc/self/exe")
            .ok()
            .and_then(|f| data_objects(&f, bias))
            .unwrap_or_default();
        v.sort_by_key(|o| o.start);
        v
    };
    if OBJECTS.set(objects).is_ok() {
        menps_dsm::dsm::race::set_symbolizer(symbolize);
    }
}

/// The object holding `addr`, as "`name` (byte N) in the program's
/// globals".
fn symbolize(addr: usize) -> Option<String> {
    let objs = OBJECTS.get()?;
    let i = objs.partition_point(|o| o.start <= addr).checked_sub(1)?;
    let o = &objs[i];
    (addr < o.start + o.size).then(|| {
        format!(
            "`{}` (byte {} of {}) in the program's globals",
            o.name,
            addr - o.start,
            o.size
        )
    })
}

/// The `STT_OBJECT` symbols with a size of the ELF file `f`, at `bias`.
fn data_objects(f: &[u8], bias: usize) -> Option<Vec<Object>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(f.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(f.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(f.get(o..o + 8)?.try_into().ok()?));
    if f.get(..4)? != b"\x7fELF" || *f.get(4)? != 2 {
        return None;
    }
    let shoff = u64_at(0x28)? as usize;
    let shentsize = u16_at(0x3a)? as usize;
    let shnum = u16_at(0x3c)? as usize;
    let sh = |i: usize| shoff + i * shentsize;
    // SHT_SYMTAB = 2; its sh_link is the string table.
    let symtab = (0..shnum).find(|&i| u32_at(sh(i) + 4) == Some(2))?;
    let (off, size, ent) = (
        u64_at(sh(symtab) + 0x18)? as usize,
        u64_at(sh(symtab) + 0x20)? as usize,
        u64_at(sh(symtab) + 0x38)? as usize,
    );
    let strtab = u32_at(sh(symtab) + 0x28)? as usize;
    let str_off = u64_at(sh(strtab) + 0x18)? as usize;
    let mut out = Vec::new();
    for k in 0..size / ent.max(1) {
        let s = off + k * ent;
        let (name, info, shndx) = (u32_at(s)? as usize, *f.get(s + 4)?, u16_at(s + 6)?);
        let (value, sz) = (u64_at(s + 8)? as usize, u64_at(s + 16)? as usize);
        // STT_OBJECT, defined, with a size.
        if info & 0xf != 1 || shndx == 0 || sz == 0 {
            continue;
        }
        let raw = f.get(str_off + name..)?;
        let end = raw.iter().position(|&b| b == 0)?;
        out.push(Object {
            start: bias + value,
            size: sz,
            name: String::from_utf8_lossy(&raw[..end]).into_owned(),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_its_statics() {
        static MARKER: [u64; 4] = [1, 2, 3, 4];
        let f = std::fs::read("/proc/self/exe").unwrap();
        let objs = data_objects(&f, 0).expect("an ELF file with a symbol table");
        // The test binary is position-independent: compare by name and size.
        assert!(
            objs.iter()
                .any(|o| o.name.contains("MARKER") && o.size == 32),
            "no MARKER among {} objects",
            objs.len()
        );
        core::hint::black_box(&MARKER);
    }
}

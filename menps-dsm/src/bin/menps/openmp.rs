//! OpenMP C programs under `menps`: `menps run` preloads the libgomp
//! replacement `libmenps_gomp.so` into programs built with `gcc -fopenmp`
//! (linked against libgomp), and `menps cc` compiles and links a program
//! against it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Environment variable naming `libmenps_gomp.so` (default: next to the
/// `menps` executable).
pub const GOMP_LIB_VAR: &str = ct_config::vars::MENPS_GOMP_LIB.name;

/// The libgomp replacement: `MENPS_GOMP_LIB`, else `libmenps_gomp.so` next
/// to this executable (where cargo builds both).
pub fn gomp_library() -> Result<PathBuf, String> {
    if let Some(p) = ct_config::vars::MENPS_GOMP_LIB.raw() {
        if p.to_string_lossy().trim().is_empty() {
            return Err(ct_config::vars::MENPS_GOMP_LIB
                .check("")
                .expect_err("an empty value is refused")
                .to_string());
        }
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{GOMP_LIB_VAR}={}: no such file", p.display()))
        };
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the menps executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let p = dir.join("libmenps_gomp.so");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build it (`cargo build --release -p menps-gomp`) or set {GOMP_LIB_VAR}",
            p.display()
        ))
    }
}

/// The shared libraries an ELF executable needs (`DT_NEEDED`), or `None`
/// if the file is not a dynamically linked 64-bit ELF file.
pub fn needed_libraries(path: &Path) -> Option<Vec<String>> {
    let f = std::fs::read(path).ok()?;
    let u16_at = |o: usize| Some(u16::from_le_bytes(f.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(f.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(f.get(o..o + 8)?.try_into().ok()?));
    if f.get(..4)? != b"\x7fELF" || *f.get(4)? != 2 {
        return None;
    }
    let (phoff, phentsize, phnum) = (
        u64_at(0x20)? as usize,
        u16_at(0x36)? as usize,
        u16_at(0x38)? as usize,
    );
    let ph = |i: usize| phoff + i * phentsize;
    // Program headers: (type, offset, vaddr, filesz).
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let (t, off, vaddr, filesz) = (
            u32_at(ph(i))?,
            u64_at(ph(i) + 8)?,
            u64_at(ph(i) + 16)?,
            u64_at(ph(i) + 32)?,
        );
        match t {
            1 => loads.push((off, vaddr, filesz)),
            2 => dynamic = Some((off as usize, filesz as usize)),
            _ => {}
        }
    }
    let (doff, dsize) = dynamic?;
    let to_off = |vaddr: u64| {
        loads
            .iter()
            .find(|&&(_, va, sz)| (va..va + sz).contains(&vaddr))
            .map(|&(off, va, _)| (off + vaddr - va) as usize)
    };
    let mut needed = Vec::new();
    let mut strtab = None;
    for k in 0..dsize / 16 {
        let (tag, val) = (u64_at(doff + 16 * k)?, u64_at(doff + 16 * k + 8)?);
        match tag {
            0 => break,
            1 => needed.push(val as usize),
            5 => strtab = to_off(val),
            _ => {}
        }
    }
    let strtab = strtab?;
    Some(
        needed
            .into_iter()
            .filter_map(|o| {
                let s = f.get(strtab + o..)?;
                let end = s.iter().position(|&b| b == 0)?;
                Some(String::from_utf8_lossy(&s[..end]).into_owned())
            })
            .collect(),
    )
}

/// For `menps run`: the `LD_PRELOAD` value that makes `program` run on
/// the replacement, if it is an OpenMP program linked against libgomp (and
/// not against the replacement already).
pub fn preload_for(program: &Path) -> Result<Option<OsString>, String> {
    let path = if program.components().count() > 1 {
        program.to_path_buf()
    } else {
        match find_in_path(program) {
            Some(p) => p,
            None => return Ok(None),
        }
    };
    let Some(needed) = needed_libraries(&path) else {
        return Ok(None);
    };
    let uses_libgomp = needed.iter().any(|n| n.starts_with("libgomp.so"));
    let uses_ours = needed.iter().any(|n| n.starts_with("libmenps_gomp"));
    if !uses_libgomp || uses_ours {
        return Ok(None);
    }
    let lib = gomp_library()?;
    let mut v = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        v.push(" ");
        v.push(old);
    }
    Ok(Some(v))
}

fn find_in_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `menps cc ARGS…`: `gcc -fopenmp ARGS…` linked against the replacement
/// (found as for `menps run`), with an rpath to it and libgomp dropped.
/// `CC` names the compiler (default `gcc`). Returns the compiler's status.
pub fn cc(args: Vec<OsString>) -> Result<i32, String> {
    let lib = gomp_library()?;
    let dir = lib.parent().unwrap_or(Path::new(".")).to_path_buf();
    let compiler = std::env::var_os("CC")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "gcc".into());
    let mut cmd = std::process::Command::new(&compiler);
    cmd.arg("-fopenmp").args(&args);
    // Linking: the replacement first and always kept; libgomp, which gcc
    // adds for -fopenmp, is dropped as unneeded.
    let linking = !args.iter().any(|a| a == "-c" || a == "-S" || a == "-E");
    if linking {
        let mut rpath = OsString::from("-Wl,-rpath,");
        rpath.push(dir.as_os_str());
        let mut libdir = OsString::from("-L");
        libdir.push(dir.as_os_str());
        cmd.arg(libdir)
            .arg(rpath)
            .arg("-Wl,--push-state,--no-as-needed")
            .arg("-lmenps_gomp")
            .arg("-Wl,--pop-state,--as-needed");
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {}: {e}", compiler.to_string_lossy()))?;
    Ok(status.code().unwrap_or(1))
}

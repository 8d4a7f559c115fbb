package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// releaseOptions are the inputs of release.
type releaseOptions struct {
	Root      string    // repository root (a git work tree)
	Version   string    // vX.Y.Z or vX.Y.Z-pre (major v0 or v1)
	DryRun    bool      // check and print the plan, change nothing
	SkipTests bool      // skip `make test`; only with DryRun
	Out       io.Writer // progress and the plan
}

// requireChange is one in-repo requirement release rewrites.
type requireChange struct {
	GoMod, Path, From, To string
}

func (c requireChange) String() string {
	return fmt.Sprintf("%s: %s %s => %s", c.GoMod, c.Path, c.From, c.To)
}

// release tags every published module at o.Version: it checks the version,
// that no such tag exists and that CHANGELOG.md has its section (a warning
// in a dry run), checks a clean work tree, runs make test,
// rewrites every in-repo requirement (in every go.mod, examples and tests
// included) to o.Version, verifies each published module in a copy of HEAD
// carrying those rewrites (see verify), then commits the rewrites and creates
// the tags <module folder>/<version>. With DryRun it stops after verify and
// prints the tags and rewrites: no file, commit or tag changes.
func release(o releaseOptions) error {
	v := o.Version
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return err
	}
	o.Root = root
	if !semver.IsValid(v) || semver.Canonical(v) != v || strings.Count(v, ".") < 2 {
		return fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH (e.g. v0.2.0)", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("version %s: major %s needs /%s module paths, which this repository does not use", v, m, m)
	}
	if o.SkipTests && !o.DryRun {
		return errors.New("--skip-tests is allowed only with --dry-run: a release runs make test")
	}
	mods, err := publishedModules(o.Root)
	if err != nil {
		return err
	}
	var tags []string
	for _, m := range mods {
		tags = append(tags, m.Dir+"/"+v)
	}
	existing, err := run(o.Root, os.Environ(), "git", "tag", "--list")
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, t := range lines(existing) {
		have[t] = true
	}
	for _, t := range tags {
		if have[t] {
			return fmt.Errorf("tag %s exists already", t)
		}
	}
	if status, err := run(o.Root, os.Environ(), "git", "status", "--porcelain"); err != nil {
		return err
	} else if status != "" {
		return fmt.Errorf("the work tree is not clean (commit or stash first):\n%s", status)
	}
	if err := checkChangelog(o.Root, v); err != nil {
		if !o.DryRun {
			return err
		}
		fmt.Fprintf(o.Out, "warning: %v\n", err)
	}
	if o.SkipTests {
		fmt.Fprintln(o.Out, "make test: skipped (--skip-tests)")
	} else {
		fmt.Fprintln(o.Out, "make test: running")
		cmd := exec.Command("make", "test")
		cmd.Dir, cmd.Stdout, cmd.Stderr, cmd.Env = o.Root, o.Out, o.Out, shellEnv()
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("make test: %w", err)
		}
	}

	scratch, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	if _, err := run(o.Root, os.Environ(), "sh", "-c", `git archive --format=tar HEAD | tar -x -C "$1"`, "sh", scratch); err != nil {
		return err
	}
	changes, err := rewriteRequires(scratch, v)
	if err != nil {
		return err
	}
	if err := verify(scratch, mods, v, o.Out); err != nil {
		return err
	}

	mode := ""
	if o.DryRun {
		mode = " (dry run)"
	}
	fmt.Fprintf(o.Out, "release %s%s: %d modules\n", v, mode, len(mods))
	for _, c := range changes {
		fmt.Fprintf(o.Out, "require %s\n", c)
	}
	for _, t := range tags {
		fmt.Fprintf(o.Out, "tag %s\n", t)
	}
	if o.DryRun {
		fmt.Fprintln(o.Out, "dry run: no file, commit or tag was changed")
		return nil
	}

	if _, err := rewriteRequires(o.Root, v); err != nil {
		return err
	}
	if len(changes) > 0 {
		if _, err := run(o.Root, os.Environ(), "git", "commit", "-a", "-m", "release "+v+": in-repo requires at "+v); err != nil {
			return err
		}
	}
	for _, t := range tags {
		if _, err := run(o.Root, os.Environ(), "git", "tag", "-a", "-m", "idem "+t, t); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.Out, "tagged; publish with: git push origin HEAD %s\n", strings.Join(tags, " "))
	return nil
}

// checkChangelog fails unless CHANGELOG.md at root has a section for
// version v ("## [X.Y.Z]", Keep a Changelog).
func checkChangelog(root, v string) error {
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return fmt.Errorf("CHANGELOG.md: %w", err)
	}
	heading := "## [" + strings.TrimPrefix(v, "v") + "]"
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, heading) {
			return nil
		}
	}
	return fmt.Errorf("CHANGELOG.md has no %q section: move the [Unreleased] entries under it first", heading)
}

// rewriteRequires sets every requirement on a module of this repository,
// in every go.mod under root, to version v (with go mod edit, which keeps
// the file's layout) and returns what it changed.
func rewriteRequires(root, v string) ([]requireChange, error) {
	mods, err := findModules(root)
	if err != nil {
		return nil, err
	}
	var changes []requireChange
	for _, m := range mods {
		gomod := filepath.Join(root, m.Dir, "go.mod")
		data, err := os.ReadFile(gomod)
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(gomod, data, nil)
		if err != nil {
			return nil, err
		}
		var args []string
		for _, r := range f.Require {
			if strings.HasPrefix(r.Mod.Path, repoPrefix) && r.Mod.Version != v {
				changes = append(changes, requireChange{GoMod: m.Dir + "/go.mod", Path: r.Mod.Path, From: r.Mod.Version, To: v})
				args = append(args, "-require="+r.Mod.Path+"@"+v)
			}
		}
		if len(args) > 0 {
			if _, err := goRun(filepath.Join(root, m.Dir), append([]string{"mod", "edit"}, args...)...); err != nil {
				return nil, err
			}
		}
	}
	return changes, nil
}

// verify checks, in root (a copy of the tree with the rewritten requires),
// for each published module:
//  1. it builds on its own (GOWORK=off, -mod=readonly), with its own go.mod
//     and go.sum unchanged, its replace directives pointing at the folders;
//  2. a user's module requiring it at version v, importing all its packages,
//     with each published module at exactly v (a versioned replace) taken
//     from its folder and every other module from the proxy, tidies and
//     builds. The module's own replace directives play no part, as for a
//     user; an in-repo requirement left at an unpublished version would make
//     the go command fetch that version and fail.
//
// It cannot check what exists only after the tags are pushed: that the
// proxy serves the tags and that the checksum database records them.
func verify(root string, mods []module, v string, out io.Writer) error {
	replace := map[string]string{}
	for _, m := range mods {
		replace[m.Path+" "+v] = filepath.Join(root, m.Dir)
	}
	for _, m := range mods {
		dir := filepath.Join(root, m.Dir)
		if _, err := run(dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly"), "go", "build", "./..."); err != nil {
			return fmt.Errorf("verify %s on its own: %w", m.Dir, err)
		}
		pkgs, err := importablePackages(dir)
		if err != nil {
			return err
		}
		cdir, err := os.MkdirTemp(root, ".consumer-")
		if err != nil {
			return err
		}
		if len(pkgs) == 0 { // a command: build its main packages as go install would resolve them
			out, err := goRun(dir, "list", "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
			if err != nil {
				return err
			}
			if err := writeConsumer(cdir, m, v, nil, replace); err != nil {
				return err
			}
			for _, p := range lines(out) {
				if _, err := goRun(cdir, "build", "-o", os.DevNull, p); err != nil {
					return fmt.Errorf("verify %s from a user's module: %w", m.Dir, err)
				}
			}
		} else {
			if err := writeConsumer(cdir, m, v, pkgs, replace); err != nil {
				return err
			}
			if _, err := goRun(cdir, "mod", "tidy"); err != nil {
				return fmt.Errorf("verify %s from a user's module: %w", m.Dir, err)
			}
			// the module's packages as the user's module resolves them (not the
			// user's main package: no link step)
			if _, err := goRun(cdir, append([]string{"build"}, pkgs...)...); err != nil {
				return fmt.Errorf("verify %s from a user's module: %w", m.Dir, err)
			}
		}
		fmt.Fprintf(out, "verified %s: builds on its own and as %s@%s from a user's module\n", m.Dir, m.Path, v)
		if warn, err := installWarning(dir); err != nil {
			return err
		} else if warn != "" {
			fmt.Fprintf(out, "warning: %s: %s\n", m.Dir, warn)
		}
	}
	return nil
}

// installWarning returns a warning when the module in dir has a main
// package and replace directives: `go install path@version` refuses such a
// module, so users could not install its command from the tag.
func installWarning(dir string) (string, error) {
	out, err := goRun(dir, "list", "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
	if err != nil {
		return "", err
	}
	mains := lines(out)
	if len(mains) == 0 {
		return "", nil
	}
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		return "", err
	}
	if len(f.Replace) == 0 {
		return "", nil
	}
	return fmt.Sprintf("go install %s@VERSION will refuse it: its go.mod has %d replace directives", mains[0], len(f.Replace)), nil
}

// shellEnv is the environment of make test: a developer's shell, without
// the GOWORK=off that scripts/release.sh sets to run this tool, so that
// make test sees the workspace (go.work) and tests every module.
func shellEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOWORK=") })
}

package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

const usage = `usage (from the repository root, or -root DIR):
  go run ./tools/release modules                  the published modules' folders, one a line
  go run ./tools/release licenses                 every published module has a LICENSE pkg.go.dev accepts
  go run ./tools/release graph                    module graph of a user's module importing each published module
  go run ./tools/release tag [--dry-run] [--skip-tests] vX.Y.Z
                                                  tag every published module (scripts/release.sh)
`

func main() {
	if err := mainErr(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func mainErr(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	root := fs.String("root", ".", "repository root")
	dryRun := fs.Bool("dry-run", false, "tag: check and print the plan; change nothing")
	skipTests := fs.Bool("skip-tests", false, "tag: skip make test (only with --dry-run)")
	// flags may come before or after the arguments (tag v0.2.0 --dry-run)
	var pos []string
	for rest := args[1:]; ; rest = fs.Args()[1:] {
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
	}
	switch args[0] {
	case "modules":
		mods, err := publishedModules(*root)
		for _, m := range mods {
			fmt.Println(m.Dir)
		}
		return err
	case "licenses":
		report, err := checkLicenses(*root)
		fmt.Println(strings.Join(report, "\n"))
		return err
	case "graph":
		mods, err := publishedModules(*root)
		if err != nil {
			return err
		}
		failed := false
		for _, m := range mods {
			rep, err := checkGraph(*root, m, mods)
			if err != nil {
				return err
			}
			fmt.Println(rep)
			failed = failed || len(rep.Problems) > 0
		}
		if failed {
			return fmt.Errorf("test-only requirements reach a user's module graph")
		}
		return nil
	case "tag":
		if len(pos) != 1 {
			return fmt.Errorf("tag needs one version\n%s", usage)
		}
		return release(releaseOptions{Root: *root, Version: pos[0], DryRun: *dryRun, SkipTests: *skipTests, Out: os.Stdout})
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// Command gosec runs gosec's analyzer, its rules and its SSA analyzers, as its own
// command does, with the three flags make lint passes: -quiet, -exclude-generated and
// -exclude. It exists because gosec's command also links its AI autofix (the OpenAI,
// Anthropic and Gemini SDKs), which make lint never uses: they and what only they need
// were 260 s of the 321 s of CPU a cold build of it took. The library is pinned by this
// module. Unlike gosec's command with -quiet, it also fails when a package does not load.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/securego/gosec/v2"
	"github.com/securego/gosec/v2/analyzers"
	"github.com/securego/gosec/v2/issue"
	"github.com/securego/gosec/v2/report"
	"github.com/securego/gosec/v2/rules"
)

func main() {
	os.Exit(run())
}

func run() int {
	quiet := flag.Bool("quiet", false, "print nothing when no issue is found")
	excludeGenerated := flag.Bool("exclude-generated", false, "skip files marked as generated")
	exclude := flag.String("exclude", "", "comma-separated rule IDs to leave out (G204,G304)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: gosec [-quiet] [-exclude-generated] [-exclude=G101,...] PACKAGES...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		return 2
	}
	logger := log.New(os.Stderr, "[gosec] ", log.LstdFlags)
	if *quiet {
		logger = log.New(io.Discard, "", 0)
	}

	config := gosec.NewConfig()
	config.SetGlobal(gosec.ExcludeRules, *exclude)
	var ruleFilters []rules.RuleFilter
	var analyzerFilters []analyzers.AnalyzerFilter
	if *exclude != "" {
		ids := strings.Split(*exclude, ",")
		ruleFilters = append(ruleFilters, rules.NewRuleFilter(true, ids...))
		analyzerFilters = append(analyzerFilters, analyzers.NewAnalyzerFilter(true, ids...))
	}
	analyzer := gosec.NewAnalyzer(config, false, *excludeGenerated, false, runtime.GOMAXPROCS(0), logger)
	analyzer.LoadRules(rules.Generate(false, ruleFilters...).RulesInfo())
	analyzer.LoadAnalyzers(analyzers.Generate(false, analyzerFilters...).AnalyzersInfo())

	excludedDirs := gosec.ExcludedDirsRegExp([]string{"vendor", `\.git/`})
	var packages []string
	for _, path := range flag.Args() {
		found, err := gosec.PackagePaths(path, excludedDirs)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gosec: %s: %v\n", path, err)
			return 1
		}
		packages = append(packages, found...)
	}
	if len(packages) == 0 {
		fmt.Fprintf(os.Stderr, "gosec: no packages in %s\n", strings.Join(flag.Args(), " "))
		return 1
	}
	// No tags of its own: make lint gives the go list that loads the packages its tags
	// in GOFLAGS, as it did to gosec's command.
	if err := analyzer.Process(nil, packages...); err != nil {
		fmt.Fprintf(os.Stderr, "gosec: %v\n", err)
		return 1
	}

	issues, metrics, errors := analyzer.Report()
	found := 0
	for _, i := range issues {
		if len(i.Suppressions) == 0 {
			found++
		}
	}
	metrics.NumFound = found
	// The most severe first, as gosec's command prints them.
	slices.SortStableFunc(issues, func(a, b *issue.Issue) int {
		return -cmp.Or(cmp.Compare(a.Severity, b.Severity), cmp.Compare(a.What, b.What),
			cmp.Compare(a.File, b.File), cmp.Compare(firstLine(a.Line), firstLine(b.Line)))
	})
	if len(issues) == 0 && len(errors) == 0 && *quiet {
		return 0
	}
	roots := make([]string, 0, flag.NArg())
	for _, path := range flag.Args() {
		root, err := gosec.RootPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gosec: %s: %v\n", path, err)
			return 1
		}
		roots = append(roots, root)
	}
	info := gosec.NewReportInfo(issues, metrics, errors).WithVersion(version())
	if err := report.CreateReport(os.Stdout, "text", false, roots, info); err != nil {
		fmt.Fprintf(os.Stderr, "gosec: the report: %v\n", err)
		return 1
	}
	if found > 0 || len(errors) > 0 {
		return 1
	}
	return 0
}

// version is the gosec release this command was built with.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/securego/gosec/v2" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// firstLine is the number an issue's line, or its range ("12-14"), starts with.
func firstLine(line string) int {
	first, _, _ := strings.Cut(line, "-")
	n, _ := strconv.Atoi(first)
	return n
}

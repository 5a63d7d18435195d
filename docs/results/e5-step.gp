set terminal pngcairo size 900,560 noenhanced
set output '/work/main/docs/results/e5-step.png'
set xlabel 'step'
set ylabel 'validation loss (average model)'
set grid
set key top right
plot '/work/main/docs/results/e5-step.dat' index 0 with linespoints title 'adamw', '/work/main/docs/results/e5-step.dat' index 1 with linespoints title 'gpa', '/work/main/docs/results/e5-step.dat' index 2 with linespoints title 'diloco-h32'

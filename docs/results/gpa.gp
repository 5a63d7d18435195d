set terminal pngcairo size 900,560 noenhanced
set output 'gpa.png'
set title 'Validation loss (average model) against step, 3 runs'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'gpa.dat' index 0 with linespoints title 'adamw', 'gpa.dat' index 1 with linespoints title 'gpa', 'gpa.dat' index 2 with linespoints title 'diloco_h32', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
